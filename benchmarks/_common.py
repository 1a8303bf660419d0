"""Helpers the benchmark scripts share: the machine description, result file names and
writers, timing (best of round-robin repeats) and a peak-RSS sampler.

Conventions (the same as ``bench_full.py``, ``bench_sklearn.py`` and ``bench_torch.py``):

- results go to ``<host>-<date>[-<name>][-quick].{json,md,png}``, ``host`` the machine's name
  with anything but letters, digits, ``_``, ``.`` and ``-`` removed (``vm-2026-11-22.md``);
- every result holds :func:`machine_info`: CPU model, logical and usable CPUs, the versions of the
  libraries that matter, the BLAS thread pools, and the thread settings of the run;
- times are ``time.perf_counter`` seconds; after one untimed warm-up run per route, the repeats
  go round-robin over the routes of a case (:func:`round_robin`) so that a busy moment of a
  shared machine hits every route alike, and the best repeat is reported;
- the 1-minute load average is recorded around each case (:func:`loadavg`).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import importlib.metadata as md
import json
import os
import platform
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: distributions whose versions :func:`machine_info` records when installed
DEFAULT_DISTRIBUTIONS = (
    "numpy",
    "scipy",
    "onnx",
    "onnxruntime-training-cpu",
    "onnxruntime-training",
    "torch",
    "scikit-learn",
    "skl2onnx",
    "ort-train-core",
    "ort-train-sklearn",
    "ort-train-torch",
)

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# ---- machine ------------------------------------------------------------------------------
def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask), else the logical CPU count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_model() -> str:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return cpu


def library_versions(distributions: Iterable[str] = DEFAULT_DISTRIBUTIONS) -> dict[str, str]:
    """Python's version and those of the installed distributions (missing ones left out);
    ``onnxruntime`` is the imported module's version (whichever build provides it)."""
    versions: dict[str, str] = {"python": sys.version.split()[0]}
    for dist in distributions:
        with contextlib.suppress(md.PackageNotFoundError):
            versions[dist] = md.version(dist)
    with contextlib.suppress(ImportError):
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    return versions


def loadavg() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def machine_info(
    torch_threads: int | None = None,
    distributions: Iterable[str] = DEFAULT_DISTRIBUTIONS,
    **extra: Any,
) -> dict[str, Any]:
    """What a result must say about the machine it ran on; ``extra`` adds run-specific keys
    (e.g. the device, the thread policy)."""
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "memory_gib": _memory_gib(),
        "loadavg_1min_at_start": loadavg(),
        "versions": library_versions(distributions),
        "onnxruntime_intra_op_threads": "default (0: one per physical core)",
    }
    if torch_threads is not None:
        info["torch_threads"] = torch_threads
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [
            {k: p.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
            for p in threadpool_info()
        ]
    except ImportError:
        pass
    info.update(extra)
    return info


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def machine_line(info: Mapping[str, Any]) -> str:
    """One Markdown sentence describing the machine and the library versions."""
    v = info["versions"]
    blas = ", ".join(
        f"{b['internal_api']} {b['version']} ({b['num_threads']} threads)" for b in info.get("blas", [])
    )
    parts = [
        f"Machine: {info['cpu']}, {info['usable_cpus']} usable CPUs "
        f"({info['logical_cpus']} logical)"
        + (f", {info['memory_gib']} GiB" if info.get("memory_gib") else "")
        + f"; {info['platform']}.",
        f"Python {v['python']}, numpy {v.get('numpy')}{f' ({blas})' if blas else ''}, "
        f"onnxruntime {v.get('onnxruntime')}, torch {v.get('torch')}, "
        f"scikit-learn {v.get('scikit-learn')}, ort-train-core {v.get('ort-train-core')}.",
    ]
    if "torch_threads" in info:
        parts.append(f"torch threads {info['torch_threads']}.")
    return " ".join(parts)


# ---- result files -------------------------------------------------------------------------
def host_name() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "", socket.gethostname()) or "machine"


def today() -> str:
    return datetime.date.today().isoformat()


def result_stem(name: str | None = None, quick: bool = False, date: str | None = None) -> str:
    """``<host>-<date>[-<name>][-quick]``, the stem every benchmark names its files with."""
    parts = [host_name(), date or today()]
    if name:
        parts.append(name)
    if quick:
        parts.append("quick")
    return "-".join(parts)


def _json_default(value: Any) -> Any:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        raise TypeError(f"not JSON serialisable: {type(value).__name__}") from None
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_json(path: str | os.PathLike[str], report: Any) -> Path:
    """Writes ``report`` (numpy scalars and arrays allowed) as indented JSON."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    return p


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text if text.endswith("\n") else text + "\n")
    return p


def fmt(value: float | None, digits: int = 5) -> str:
    """A number with ``digits`` significant digits, an em dash for None."""
    return "—" if value is None else f"{value:.{digits}g}"


def markdown_table(header: list[str], rows: Iterable[list[str]], align: list[str] | None = None) -> list[str]:
    """Lines of a Markdown table; ``align`` holds ``'l'`` or ``'r'`` per column (default: the
    first column left, the others right)."""
    align = align or ["l"] + ["r"] * (len(header) - 1)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# ---- timing -------------------------------------------------------------------------------
def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call, time.perf_counter."""
    t = time.perf_counter()
    result = fn()
    return time.perf_counter() - t, result


def torch_sgd_loop(
    model: Any,
    batches: Sequence[tuple[Any, Any]],
    loss_fn: Callable[[Any, Any], Any],
    lr: float,
    epochs: int,
    losses: np.ndarray,
    after_epoch: Callable[[], None] | None = None,
) -> float:
    """The timed loop of every torch peer: ``torch.optim.SGD`` (no momentum) over the batches,
    ``loss.item()`` into ``losses[i]`` each step, ``after_epoch`` at each epoch's end (inside the
    timing, as it is part of the route's work); returns the seconds."""
    import torch

    t = time.perf_counter()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
    for _ in range(epochs):
        for i, (xb, yb) in enumerate(batches):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            losses[i] = loss.item()
        if after_epoch is not None:
            after_epoch()
    return time.perf_counter() - t


def round_robin(runs: Mapping[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """``repeats`` rounds, each calling every run once in order; each run returns its own timed
    seconds (so that it can leave its preparation out). A busy moment of a shared machine then
    hits every route alike instead of one route's whole series."""
    times: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            times[key].append(float(run()))
    return times


# ---- memory -------------------------------------------------------------------------------
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    """The resident set size of this process: ``/proc/self/statm`` (Linux), else psutil."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        return None


def release_free_memory() -> None:
    """``gc.collect()``, then glibc's ``malloc_trim(0)`` (where there is one), so that memory
    freed by an earlier route goes back to the OS and does not hide the next route's growth."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class RssSampler:
    """Samples the process RSS every ``interval`` seconds in a daemon thread between ``start``
    and ``stop``; ``peak_delta`` is the highest sample minus the RSS at ``start`` (bytes).

    The thread takes the GIL for a few microseconds per sample: use it around untimed runs."""

    METHOD = (
        "peak RSS of the process (/proc/self/statm, sampled every {ms:g} ms by a thread, plus a "
        "sample at the end) during the route's setup and its first (untimed) run, minus the RSS "
        "just before, after gc.collect() and malloc_trim(0); allocations that reuse memory "
        "already held by the process are not seen"
    )

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.baseline: int | None = None
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def method(self) -> str:
        return self.METHOD.format(ms=1e3 * self.interval)

    def _sample(self) -> None:
        value = rss_bytes()
        if value is not None and (self.peak is None or value > self.peak):
            self.peak = value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> RssSampler:
        release_free_memory()
        self.baseline = rss_bytes()
        self.peak = self.baseline
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return self.peak_delta

    @property
    def peak_delta(self) -> int | None:
        if self.baseline is None or self.peak is None:
            return None
        return max(0, self.peak - self.baseline)

    @contextlib.contextmanager
    def measure(self) -> Iterator[RssSampler]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


# ---- models ---------------------------------------------------------------------------------
def mlp_onnx(
    layers: Sequence[tuple[np.ndarray, np.ndarray]],
    names: tuple[str, str] = ("coef", "bias"),
    output: str = "variable",
    graph_name: str = "mlp",
) -> Any:
    """MatMul/Add(/Relu between layers) prediction graph (opset 17, IR 8): input ``X`` [N, F],
    initializers ``{names[0]}{k}`` (in x out) and ``{names[1]}{k}`` holding copies of ``layers``;
    a single layer is a linear model."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    current = "X"
    w_name, b_name = names
    for k, (W, b) in enumerate(layers):
        W32, b32 = np.array(W, dtype=np.float32), np.array(b, dtype=np.float32)
        inits += [numpy_helper.from_array(W32, f"{w_name}{k}"), numpy_helper.from_array(b32, f"{b_name}{k}")]
        last = k == len(layers) - 1
        nodes.append(helper.make_node("MatMul", [current, f"{w_name}{k}"], [f"mm{k}"]))
        out = output if last else f"pre{k}"
        nodes.append(helper.make_node("Add", [f"mm{k}", f"{b_name}{k}"], [out]))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"act{k}"]))
            out = f"act{k}"
        current = out
    n_in, n_out = np.shape(layers[0][0])[0], np.shape(layers[-1][0])[1]
    graph = helper.make_graph(
        nodes,
        graph_name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["N", n_out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
