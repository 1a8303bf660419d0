"""``python -m ort_train_core``: the ``ort-train`` command."""

from .cli import main

raise SystemExit(main())
