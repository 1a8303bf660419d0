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
import errno
import hashlib
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import numpy as np
from onnx import ModelProto

from ._io import check_regular_file
from ._npz import read_npz

#: the file a trainer with ``checkpoint_dir`` writes in that folder
CHECKPOINT_FILE = "checkpoint.npz"
FORMAT = "ort-train-checkpoint"
FORMAT_VERSION = 1

__all__ = ["CHECKPOINT_FILE", "checkpoint_info", "model_fingerprint", "read_checkpoint", "write_checkpoint"]


def model_fingerprint(model: ModelProto) -> str:
    """sha256 of a graph's deterministic serialization: the same architecture (trained weights
    as inputs, so their values do not count) gives the same fingerprint in any process.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; only its graph counts.

    Returns
    -------
    str
        The hexadecimal digest.
    """
    return hashlib.sha256(model.graph.SerializeToString(deterministic=True)).hexdigest()


def write_checkpoint(
    path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]
) -> None:
    """Writes a checkpoint file atomically (:func:`write_atomically`).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` file to write; missing folders are created.
    arrays : mapping of str to ndarray
        The arrays, by key (not ``'meta'``).
    meta : mapping of str to object
        A JSON-serializable document, stored with the format name and version.
    """
    path = os.fspath(path)
    document = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta}
    payload = {k: np.asarray(v, order="C") for k, v in arrays.items()}
    payload["meta"] = np.frombuffer(json.dumps(document).encode("utf-8"), dtype=np.uint8)
    savez: Any = np.savez  # keyword arrays; numpy's stubs read them as its own options
    write_atomically(path, lambda f: savez(f, **payload), prefix=".checkpoint-")


def write_atomically(path: str, write: Callable[[BinaryIO], object], prefix: str = ".ort-train-") -> None:
    """``write`` fills a temporary file beside ``path``, flushed and fsynced, which then
    replaces ``path``: a crash (even SIGKILL) leaves the old file or the new one, never half of
    one (at worst a hidden temporary, which the next write in that folder removes).

    The file gets the mode any file the user creates gets (0o666 less the umask).

    Parameters
    ----------
    path : str
        The file to write; missing folders are created.
    write : callable
        Writes the content to the binary file it is given.
    prefix : str, default='.ort-train-'
        The start of the temporary file's name.

    Raises
    ------
    OSError
        The folder cannot be written; ``path`` is left as it was.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    _remove_stale_temporaries(folder, prefix)
    fd, tmp = _create_temporary(folder, prefix)
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


def check_writable_folder(folder: str) -> None:
    """Raises the OSError a write in ``folder`` would raise (no permission, read-only file
    system...), by creating and removing a temporary there: what the process may really do,
    which ``os.access`` does not tell (root, ACLs, read-only mounts).

    Parameters
    ----------
    folder : str
        An existing folder.

    Raises
    ------
    OSError
        A file cannot be created in ``folder``.
    """
    fd, tmp = _create_temporary(folder, ".ort-train-")
    os.close(fd)
    os.unlink(tmp)


def _create_temporary(folder: str, prefix: str) -> tuple[int, str]:
    """A new empty file ``folder/<prefix><random>.tmp``, open for writing.

    Created with mode 0o666, so that the kernel applies the umask (and a default ACL) as to
    any file the user creates; ``tempfile.mkstemp`` gives 0o600, which the final file would keep.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        tmp = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", folder)


#: (folder, prefix) pairs already cleaned by this process: a folder is scanned once, not at
#: every checkpoint
_CLEANED: set[tuple[str, str]] = set()

#: when this module was imported: the start of the process where /proc does not say it
_IMPORTED_AT = time.time()


def _process_start() -> float:
    """When this process started (Linux /proc; elsewhere when this module was imported)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        # btime is truncated to the second: the result is at most 1 s early, never late
        return min(boot + ticks / os.sysconf("SC_CLK_TCK"), _IMPORTED_AT)
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


def _remove_stale_temporaries(folder: str, prefix: str) -> None:
    """Removes ``prefix*.tmp`` regular files last modified before this process started: a
    writer killed mid-write (SIGKILL, power loss) leaves its temporary behind, and no write
    still running in this process or any other started since can be that old."""
    if (folder, prefix) in _CLEANED:
        return
    _CLEANED.add((folder, prefix))
    started = _process_start()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
            continue
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(info.st_mode) and info.st_mtime < started:
                os.unlink(entry.path)


def read_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Reads a checkpoint file without pickle.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` file.

    Returns
    -------
    arrays : dict of str to ndarray
        The arrays, by key.
    meta : dict of str to object
        The JSON document.

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        The file is missing, or is a folder.
    ValueError
        The file is not an ort-train checkpoint of this format version (not a regular file,
        not a zip of ``.npy`` arrays, forged headers, pickled objects, a bad meta document).
    """
    path = check_regular_file(path, "checkpoint")  # a FIFO would block the read
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
    polling for a run in another process.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint file.

    Returns
    -------
    dict of str to object
        The meta document of :func:`read_checkpoint`.

    Raises
    ------
    FileNotFoundError, IsADirectoryError, ValueError
        As :func:`read_checkpoint`.
    """
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
