"""``python -m ort_train_core``: the ``ort-train`` command (Ctrl-C and setup errors handled as
the console script handles them, once this package has imported)."""

from _ort_train_cli import main

raise SystemExit(main())
