"""Runs every benchmark: the benchmark matrix (``matrix.py``), then the target benchmarks
``bench_full.py``, ``bench_sklearn.py``, ``bench_torch.py``, ``bench_memory.py``,
``bench_zoo.py`` and ``bench_threads.py`` (their ``main(argv)``, with ``--quick`` and ``--out`` forwarded).

Usage: ``python benchmarks/run.py [--quick] [--device cpu|cuda] [--out benchmarks/results]``.

- ``--quick``: the matrix's quick subset and the target scripts' quick modes (a few minutes on
  2 cores); without it the whole grid (about half an hour on 2 cores).
- ``--device cuda``: the matrix's ort-train routes, the onnxruntime training API and torch on
  the GPU (numpy and scikit-learn stay on the CPU); exits with status 2 at once when the CUDA
  build of onnxruntime-training is not there. The target scripts are CPU benchmarks.
- A part that raises (or returns a non-zero status, or a matrix route that fails) is reported
  and the others still run; the exit status is then 1.

Results: the matrix's ``<host>-<date>-matrix[-cuda][-quick].{json,md}`` and PNG plots, and each
target script's own files, all in ``--out``.
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
import matrix  # noqa: E402

TARGET_SCRIPTS = ("bench_full", "bench_sklearn", "bench_torch", "bench_memory", "bench_zoo", "bench_threads")


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


def run_matrix(args: argparse.Namespace) -> int | str:
    print(f"==== matrix ({'quick' if args.quick else 'full'}, device {args.device})", flush=True)
    report = matrix.run_matrix(
        quick=args.quick, device=args.device, out=args.out, torch_threads=args.torch_threads
    )
    for f in report["failed"]:
        print(f"  FAILED {f['case']} {matrix.ROUTE_LABELS[f['route']]}: {f['error']}", file=sys.stderr)
    print(f"matrix files: {', '.join(report['files'])}", flush=True)
    return f"{len(report['failed'])} route run(s) failed" if report["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    matrix.add_arguments(parser)
    parser.add_argument("--skip-matrix", action="store_true", help="run the target scripts only")
    parser.add_argument("--skip-targets", action="store_true", help="run the matrix only")
    args = parser.parse_args(argv)
    if args.device == "cuda" and (reason := matrix.cuda_unavailable_reason()) is not None:
        print(f"run.py --device cuda cannot run here: {reason}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    parts = [] if args.skip_matrix else [run_part("matrix", lambda: run_matrix(args))]
    forwarded = ["--out", str(args.out)] + (["--quick"] if args.quick else [])
    for name in () if args.skip_targets else TARGET_SCRIPTS:
        print(f"\n==== {name} {' '.join(forwarded)}", flush=True)
        parts.append(run_part(name, lambda name=name: importlib.import_module(name).main(forwarded)))
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
