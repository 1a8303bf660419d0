"""The benchmarks' report writer and what every benchmark shares: the machine description,
result files, Markdown tables, targets, and a peak-RSS sampler.

Conventions of every benchmark:

- results go to ``<host>-<date>[-<name>][-quick].{json,md,png}``, ``host`` the machine's name
  with anything but letters, digits, ``_``, ``.`` and ``-`` removed (``vm-2026-11-22.md``);
  ``docs/conf.py`` shows the newest Markdown and PNG files of each series;
- every result holds :func:`machine_info`: CPU model, logical and usable CPUs, the versions of the
  libraries that matter, the BLAS thread pools, and the thread settings of the run;
- times are ``time.perf_counter`` seconds; after one untimed warm-up run per route, the repeats
  go round-robin over the routes of a case so that a busy moment of a shared machine hits every
  route alike, and the best repeat is reported;
- the 1-minute load average is recorded around each case (:func:`loadavg`).
"""

from __future__ import annotations

import argparse
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
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: distributions whose versions :func:`machine_info` records when installed
DEFAULT_DISTRIBUTIONS = (
    *("numpy", "scipy", "onnx", "onnxruntime-training-cpu", "onnxruntime-training", "torch"),
    *("scikit-learn", "skl2onnx", "ort-train-core", "ort-train-sklearn", "ort-train-torch"),
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
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


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


def write_report(
    out: str | os.PathLike[str], name: str | None, quick: bool, report: Any, markdown: str
) -> tuple[Path, Path]:
    """Writes a benchmark's result files.

    Parameters
    ----------
    out : path
        The folder (created).
    name : str or None
        The benchmark's name in the stem (:func:`result_stem`).
    quick : bool
        Whether the stem ends with ``-quick``.
    report : dict
        Written as ``<stem>.json`` (numpy scalars and arrays allowed); its ``date`` dates the stem.
    markdown : str
        Written as ``<stem>.md``.

    Returns
    -------
    (Path, Path)
        The JSON and Markdown files.
    """
    stem = result_stem(name, quick, report.get("date"))
    # numpy scalars and arrays become numbers and lists
    text = json.dumps(report, indent=2, default=_json_default)
    paths = write_text(Path(out) / f"{stem}.json", text), write_text(Path(out) / f"{stem}.md", markdown)
    print(f"wrote {paths[0]} and {paths[1]}", flush=True)
    return paths


def arguments(description: str | None, quick: str) -> argparse.ArgumentParser:
    """A parser with ``--quick`` (``quick`` says what it changes) and ``--out``."""
    parser = argparse.ArgumentParser(description=(description or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--out", default=str(RESULTS_DIR), help="folder of the result files")
    return parser


def load_text(cases: Iterable[Mapping[str, Any]]) -> str:
    """``name before-after, ...``: the 1-minute load average around each case."""
    loads = [(c["name"], c["loadavg_1min"]) for c in cases if None not in c["loadavg_1min"]]
    return ", ".join(f"{name} {a:.1f}-{b:.1f}" for name, (a, b) in loads) + "."


def check_targets(
    targets: Iterable[tuple[str, str | None, str, str, str, float]], cases: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Checks targets on the us/step ratio of two routes.

    Parameters
    ----------
    targets : iterable of tuples
        ``(name, case name or None for every case, numerator route, denominator route, '<=' or
        '>=', bound)``.
    cases : sequence of dict
        Case records with ``name`` and ``routes`` (route -> measures with ``us_per_step``).

    Returns
    -------
    list of dict
        Per target and case: ``target``, ``case``, ``ratio``, ``op``, ``bound``, ``pass``.
    """
    rows = []
    for name, case_name, num, den, op, bound in targets:
        for case in cases:
            routes = case["routes"]
            if case_name not in (None, case["name"]) or num not in routes or den not in routes:
                continue
            ratio = routes[num]["us_per_step"] / routes[den]["us_per_step"]
            ok = ratio <= bound if op == "<=" else ratio >= bound
            rows.append(
                {"target": name, "case": case["name"], "ratio": ratio, "op": op, "bound": bound, "pass": ok}
            )
    return rows


def targets_table(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The Markdown lines of :func:`check_targets`' rows."""
    return markdown_table(
        ["target", "case", "ratio", "bound", "result"],
        [
            [
                t["target"],
                t["case"],
                f"{t['ratio']:.2f}",
                f"{t['op']} {t['bound']}",
                "PASS" if t["pass"] else "MISS",
            ]
            for t in rows
        ],
        ["l", "l", "r", "r", "l"],
    )


def route_notes(notes: Iterable[tuple[str, str, str]]) -> list[str]:
    """``- label (where): note`` lines from (label, where, note), each (label, note) once."""
    seen: set[tuple[str, str]] = set()
    lines = []
    for label, where, note in notes:
        if (label, note) not in seen:
            seen.add((label, note))
            lines.append(f"- {label} ({where}): {note}")
    return lines


def child_result(
    cmd: Sequence[str], prefix: str, timeout: float | None = None, live_stderr: bool = False
) -> Any:
    """Runs ``cmd`` (a benchmark in a fresh interpreter, ``PYTHONWARNINGS=ignore`` unless set):
    the JSON its stdout's last line starting with ``prefix`` holds, else a str saying why none
    (the timeout, or the exit status and the last lines of stderr; ``live_stderr``: the child's
    stderr goes to ours as it runs)."""
    env = {"PYTHONWARNINGS": "ignore", **os.environ}
    try:
        err = None if live_stderr else subprocess.PIPE
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s"
    found = [line for line in proc.stdout.splitlines() if line.startswith(prefix)]
    if found:
        return json.loads(found[-1][len(prefix) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return f"exit status {proc.returncode}: " + " | ".join(tail)


# ---- threads ------------------------------------------------------------------------------
def force_session_threads(threads: int) -> Callable[[], None]:
    """Every onnxruntime session ort-train creates from now on gets ``threads`` intra-op threads
    (the comparison at equal threads; ort-train's own policy gives small fused steps one).
    Returns the function that undoes it (benchmarks run one after another in one process)."""
    from ort_train_core import _binding

    new_session = _binding._new_session

    def patched(model: Any, data: bytes, device: Any, _threads: int | None, reuse_memory: bool) -> Any:
        return new_session(model, data, device, threads, reuse_memory)

    _binding._new_session = patched  # type: ignore[assignment]
    # the scikit-learn adapter's prediction sessions are made apart (ort_train_sklearn may be
    # absent: the core benchmarks)
    try:
        from ort_train_sklearn import _base
    except ImportError:
        _base = None
    inference_session = getattr(_base, "inference_session", None)
    if _base is not None:
        _base.inference_session = lambda model, device, _threads: inference_session(model, device, threads)

    def undo() -> None:
        _binding._new_session = new_session  # type: ignore[assignment]
        if _base is not None:
            _base.inference_session = inference_session

    return undo


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
