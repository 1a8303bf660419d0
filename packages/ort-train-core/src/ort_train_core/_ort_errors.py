"""onnxruntime's run-time failures in its own words, without the C++ context (source file,
line, function signature) its messages start with."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

#: the node a failing kernel belongs to, and onnxruntime's status message
_RUNNING = re.compile(r"while running (\w+) node\. Name:'([^']*)' Status Message: (.*)", re.DOTALL)
#: an ORT_ENFORCE's context: "path/file.cc:123 ReturnType Namespace::Function(args) "
_CPP_CONTEXT = re.compile(r"\S+\.(?:cc|cpp|h):\d+ [^(]*\([^)]*\)\s*")
#: the prefixes onnxruntime's Python layer puts before a status
_PREFIXES = re.compile(r"^(?:\[ONNXRuntimeError\] : \d+ : \w+ : |Error in [\w ]*execution: )+")


def is_onnxruntime_error(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by onnxruntime running a graph (its pybind exception types,
    or the RuntimeError its run methods raise with a failed status).

    Parameters
    ----------
    exc : BaseException
        The exception.

    Returns
    -------
    bool
        True for onnxruntime's errors, False for anything else (a callback's own RuntimeError).
    """
    if type(exc).__module__.startswith("onnxruntime"):
        return True
    text = str(exc)
    return type(exc) is RuntimeError and (
        text.startswith(("Error in execution", "Error in backward pass execution", "[ONNXRuntimeError]"))
        or "Non-zero status code returned while running" in text
    )


def run_failure(exc: BaseException) -> str:
    """onnxruntime's failure to run a step, in its words: the node and operator it names
    (when it names one) and the status message without the C++ context.

    Parameters
    ----------
    exc : BaseException
        onnxruntime's exception.

    Returns
    -------
    str
        One line.
    """
    text = _PREFIXES.sub("", str(exc).strip())
    found = _RUNNING.search(text)
    if found is not None:
        op, node, status = found.groups()
        detail = _CPP_CONTEXT.sub("", status).strip()
        text = f"node {node!r} (operator {op}): {detail}"
    text = _CPP_CONTEXT.sub("", text)
    return " ".join(text.split())


@contextmanager
def onnxruntime_errors(what: str, error: type[Exception] = RuntimeError) -> Iterator[None]:
    """Re-raises onnxruntime's errors in the block as ``error`` in our words:
    ``onnxruntime failed <what>: node 'n' (operator Op): <status>``, onnxruntime's exception as
    the ``__cause__``; any other exception passes unchanged.

    Parameters
    ----------
    what : str
        Where it failed, e.g. ``"in the training forward"``.
    error : type of Exception, default=RuntimeError
        The exception raised instead.

    Yields
    ------
    None
    """
    try:
        yield
    except Exception as exc:
        if not is_onnxruntime_error(exc):
            raise
        raise error(
            f"onnxruntime failed {what}: {run_failure(exc)}; check the inputs' shapes and values "
            "against the graph's"
        ) from exc
