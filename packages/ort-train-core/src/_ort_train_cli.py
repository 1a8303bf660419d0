"""The ``ort-train`` console script's entry point, a module outside the ``ort_train_core``
package.

Importing ``ort_train_core`` (numpy, onnx, onnxruntime: a second or more) happens inside
:func:`main` here, so that a Ctrl-C during those imports ends the command as a Ctrl-C during
training does (exit 130, one line, no traceback), and a missing training build of onnxruntime
is reported with its fix instead of a traceback (exit 2). An entry point inside the package
could catch neither: Python runs the package's ``__init__`` before any code of its modules.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

EXIT_BAD_INPUT, EXIT_INTERRUPTED = 2, 130


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``ort-train`` with ``argv`` (default: the command line).

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after the program name.

    Returns
    -------
    int
        The exit code (see :mod:`ort_train_core.cli`).
    """
    try:
        try:
            from ort_train_core.cli import main as run
        except ImportError as exc:  # TrainingRuntimeError: the message holds the pip commands
            print(f"ort-train: error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return run(argv)
    except KeyboardInterrupt:
        print("ort-train: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
