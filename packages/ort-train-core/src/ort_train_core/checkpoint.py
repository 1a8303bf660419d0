"""Checkpoint files: a trainer's whole training state in one ``.npz`` without pickle.

Arrays (weights, optimizer states) are stored under positional keys (``w0``, ``s0_0``...) so
that any weight name is safe; everything else (names, step and epoch counts, the shuffling RNG's
state, the loss history, the learning-rate signature, the model fingerprint) is one JSON
document stored as bytes under ``meta``. Loading uses ``allow_pickle=False``: a checkpoint from
elsewhere can hold wrong numbers, never code.

Files are written atomically (a temporary file in the same folder, flushed and fsynced, then
``os.replace``): a crash or SIGKILL leaves either the previous checkpoint or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import numpy as np
from onnx import ModelProto

from ._npz import read_npz

#: the file a trainer with ``checkpoint_dir`` writes in that folder
CHECKPOINT_FILE = "checkpoint.npz"
FORMAT = "ort-train-checkpoint"
FORMAT_VERSION = 1

__all__ = ["CHECKPOINT_FILE", "checkpoint_info", "model_fingerprint", "read_checkpoint", "write_checkpoint"]


def model_fingerprint(model: ModelProto) -> str:
    """sha256 of a graph's deterministic serialization: the same architecture (trained weights
    as inputs, so their values do not count) gives the same fingerprint in any process."""
    return hashlib.sha256(model.graph.SerializeToString(deterministic=True)).hexdigest()


def write_checkpoint(
    path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]
) -> None:
    """Writes ``arrays`` and the JSON-serializable ``meta`` to ``path`` atomically."""
    path = os.fspath(path)
    document = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta}
    payload = {k: np.asarray(v, order="C") for k, v in arrays.items()}
    payload["meta"] = np.frombuffer(json.dumps(document).encode("utf-8"), dtype=np.uint8)
    savez: Any = np.savez  # keyword arrays; numpy's stubs read them as its own options
    write_atomically(path, lambda f: savez(f, **payload), prefix=".checkpoint-")


def write_atomically(path: str, write: Callable[[BinaryIO], object], prefix: str = ".ort-train-") -> None:
    """``write`` fills a temporary file beside ``path``, flushed and fsynced, which then
    replaces ``path``: a crash (even SIGKILL) leaves the old file or the new one, never half of
    one (at worst a hidden temporary)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def read_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, meta) of a checkpoint; ValueError when the file is not one."""
    path = os.fspath(path)
    # not a zip, truncated, headers that are missing, forged or declare pickled objects:
    # ValueError naming the file, before any allocation a header merely claims
    arrays = read_npz(path, "checkpoint")
    raw = arrays.pop("meta", None)
    try:
        if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
            raise ValueError("no meta entry")
        meta = _parse_meta(raw.tobytes().decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{path} is not an ort-train checkpoint: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not an ort-train checkpoint (format {meta.get('format')!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path} has checkpoint format version {meta.get('format_version')!r}; this version of "
            f"ort-train reads version {FORMAT_VERSION}"
        )
    return arrays, meta


#: nesting the meta document may have: ours is 4 deep (rng -> state -> key -> array); a
#: forged one 200,000 deep would exhaust the recursion of json and of the restoring code
MAX_META_DEPTH = 16


def _parse_meta(text: str) -> dict[str, Any]:
    """The meta JSON object; ValueError when it is not one or nests deeper than MAX_META_DEPTH.

    The depth is measured on the text first (brackets outside strings), so that json.loads
    never recurses deeply."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    if deepest > MAX_META_DEPTH:
        raise ValueError(f"meta nests {deepest} levels deep (at most {MAX_META_DEPTH})")
    meta = json.loads(text)
    if not isinstance(meta, dict):
        raise ValueError("meta is not a JSON object")
    return meta


def checkpoint_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON part of a checkpoint (``n_iter_``, ``n_steps``, losses...): cheap progress
    polling for a run in another process."""
    return read_checkpoint(path)[1]


def _fsync_folder(folder: str) -> None:
    """Makes the rename itself durable (POSIX); a no-op where folders cannot be opened."""
    if os.name != "posix":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
