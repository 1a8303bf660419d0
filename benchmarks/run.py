"""Runs every benchmark: the target scripts ``bench_full.py``, ``bench_sklearn.py``,
``bench_torch.py``, ``bench_memory.py``, ``bench_zoo.py`` (its test sizes, then its real-size
preset ``--real``: ``bench_zoo_real``) and ``bench_graph_prep.py`` (their ``main(argv)``, with
``--quick`` and ``--out`` forwarded).

Usage: ``python benchmarks/run.py [--quick] [--out benchmarks/results] [--only NAME ...]``.

- ``--quick``: each script's quick mode (a few minutes on 2 cores in all; the real-size preset
  on the MLP only).
- A part that raises (or returns a non-zero status) is reported and the others still run; the
  exit status is then 1.

Each script writes its own ``<host>-<date>-<name>[-quick].{json,md}`` files in ``--out``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import _common as common  # noqa: E402

TARGET_SCRIPTS = (
    "bench_full",
    "bench_sklearn",
    "bench_torch",
    "bench_memory",
    "bench_zoo",
    "bench_zoo_real",
    "bench_graph_prep",
)


def run_part(name: str, part: Callable[[], Any]) -> tuple[str, int | str, float]:
    """(name, status, seconds) of ``part()``: its return value, or 'raised ...'."""
    t = time.perf_counter()
    try:
        status: Any = part()
    except SystemExit as exc:  # argparse errors and explicit exits
        status = exc.code
    except Exception as exc:
        traceback.print_exc()
        status = f"raised {type(exc).__name__}: {exc}"
    return (
        name,
        (status or 0) if isinstance(status, (int, str, type(None))) else str(status),
        time.perf_counter() - t,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="each script's quick mode")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results", help="folder of the reports")
    parser.add_argument("--only", nargs="+", choices=TARGET_SCRIPTS, help="run these scripts only")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    parts = []
    forwarded = ["--out", str(args.out)] + (["--quick"] if args.quick else [])
    for name in args.only or TARGET_SCRIPTS:
        argv = forwarded + (
            ["--real", *(["--only", "mlp-784"] if args.quick else [])] if name == "bench_zoo_real" else []
        )
        print(f"\n==== {name} {' '.join(argv)}", flush=True)
        module = name.removesuffix("_real")
        parts.append(run_part(name, lambda m=module, a=argv: importlib.import_module(m).main(a)))
    elapsed = time.perf_counter() - t_start
    print("\n==== run.py summary", flush=True)
    print(f"machine: {common.machine_line(common.machine_info())}")
    for name, status, seconds in parts:
        print(f"  {name:<14} {seconds:7.1f} s  {'ok' if status == 0 else f'FAILED ({status})'}")
    print(f"  {'total':<14} {elapsed:7.1f} s ({elapsed / 60:.1f} min){', quick' if args.quick else ''}")
    if any(status != 0 for _, status, _ in parts):
        print("some benchmarks failed: see above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
