"""Where the full loop's step time goes on each zoo architecture: onnxruntime's own profiler
(``SessionOptions.enable_profiling``) on the fused step session of ``OrtGradientOptimizer``.

Prints, per architecture, the share of the kernel time of each operator type over the timed
steps (the first epoch, warm-up, excluded), and the session run time those kernels sum to.
Run: ``python benchmarks/profile_zoo.py [--only lstm resnet] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import warnings
from collections import Counter
from typing import Any

import _common as common
import bench_zoo as bz


def profiled_sessions(folder: str) -> list[Any]:
    """Makes every session ort-train creates from now on write a profile under ``folder``;
    returns the list the sessions are appended to."""
    from onnxruntime.capi import _pybind_state as capi

    from ort_train_core import _binding

    sessions: list[Any] = []
    options = capi.SessionOptions

    class Profiled(options):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.enable_profiling = True
            self.profile_file_prefix = os.path.join(folder, f"s{len(sessions)}")

    _binding.ort_capi.SessionOptions = Profiled
    new_session = _binding._new_session

    def keep(*args: Any) -> Any:
        sess = new_session(*args)
        sessions.append(sess)
        return sess

    _binding._new_session = keep  # type: ignore[assignment]
    return sessions


def op_shares(path: str, skip_runs: int) -> tuple[Counter[str], float, int]:
    """Kernel microseconds per operator type after the first ``skip_runs`` session runs, their
    total, and the runs counted."""
    with open(path) as f:
        events = json.load(f)
    runs = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    start = runs[skip_runs] if len(runs) > skip_runs else 0
    per_op: Counter[str] = Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            per_op[e["args"].get("op_name", "?")] += e["dur"]
    return per_op, sum(per_op.values()), len(runs) - skip_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", nargs="*", default=["lstm", "resnet", "mobilenet", "transformer"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    import ort_train_core as otc

    torch.set_num_threads(args.threads)
    common.force_session_threads(args.threads)
    folder = tempfile.mkdtemp()
    for name in args.only:
        sessions = profiled_sessions(folder)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            job = bz.Job(name, 8, 3)
            score = "cross_entropy" if job.task == "classification" else "squared_error"
            lr = otc.LearningRateSGD(eta0=bz.LEARNING_RATE, learning_rate="constant")
            otc.OrtGradientOptimizer(
                otc.add_loss_output(job.model, score_name=score),
                max_iter=job.epochs,
                batch_size=bz.BATCH,
                shuffle=False,
                learning_rate=lr,
            ).fit(job.fit_input, job.y)
        for sess in sessions:
            per_op, total, runs = op_shares(sess.end_profiling(), len(job.bounds))
            if runs < 1 or not total:
                continue
            top = ", ".join(f"{op} {us / total:.0%}" for op, us in per_op.most_common(8))
            print(f"{name}: {total / runs:.0f} us of kernels per run over {runs} runs: {top}", flush=True)


if __name__ == "__main__":
    main()
