"""Checkpoint files: a trainer's whole training state in one ``.npz`` without pickle, and the
callback that writes them during a fit.

Arrays (weights, optimizer states) are stored under positional keys (``w0``, ``s0_0``...) so
that any weight name is safe; everything else (names, step and epoch counts, the shuffling RNG's
state, the loss history, the learning-rate signature, the model fingerprint) is one JSON
document stored as bytes under ``meta``. Loading uses ``allow_pickle=False``: a checkpoint from
elsewhere can hold wrong numbers, never code.

Files are written atomically (a temporary file in the same folder, flushed and fsynced, then
``os.replace``): a crash or SIGKILL leaves either the previous checkpoint or the new one.

:class:`TrainingState` and :class:`TrainingProgress` are what a checkpoint holds;
:func:`save_training` and :func:`load_training` turn them into a file and back, and
:func:`check_checkpoint` refuses a file that another model or another run wrote.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
from onnx import ModelProto

from ._data import is_sparse
from ._io import check_regular_file
from ._npz import read_npz
from ._padded import is_padded
from .callbacks import Callback
from .exceptions import CheckpointMismatchError

if TYPE_CHECKING:
    from ._fit_loop import BaseOrtTrainer

#: the file a trainer with ``checkpoint_dir`` writes in that folder
CHECKPOINT_FILE = "checkpoint.npz"
FORMAT = "ort-train-checkpoint"
FORMAT_VERSION = 1

__all__ = [
    "CHECKPOINT_FILE",
    "CheckpointWriter",
    "TrainingProgress",
    "TrainingState",
    "check_checkpoint",
    "checkpoint_info",
    "data_fingerprint",
    "load_training",
    "model_fingerprint",
    "read_checkpoint",
    "resume_record",
    "save_training",
    "write_checkpoint",
]


@dataclass
class TrainingState:
    """Everything a continued fit needs besides its history, on the host.

    Parameters
    ----------
    weights : dict of str to numpy.ndarray
        The trained weights by name, in the trainer's order.
    optimizer : dict of str to list of numpy.ndarray, optional
        The optimizer's states of each weight (momentum, Adam's moments); absent for a plain
        SGD.
    n_steps : int, optional
        The steps taken so far (Adam's bias corrections count them).
    n_samples : int, optional
        The rows those steps read (per-sample learning-rate schedules count them).

    Attributes
    ----------
    weights, optimizer, n_steps, n_samples
        As given.
    """

    weights: dict[str, np.ndarray]
    optimizer: dict[str, list[np.ndarray]] = field(default_factory=dict)
    n_steps: int = 0
    n_samples: int = 0

    def copy(self) -> TrainingState:
        """A deep copy: new arrays, the same values.

        Returns
        -------
        TrainingState
            The copy.
        """
        return TrainingState(
            {k: v.copy() for k, v in self.weights.items()},
            {k: [a.copy() for a in v] for k, v in self.optimizer.items()},
            self.n_steps,
            self.n_samples,
        )


@dataclass
class TrainingProgress:
    """A fit's progress at the end of an epoch: what a checkpoint holds besides the identity of
    the model and run that wrote it.

    Parameters
    ----------
    state : TrainingState
        Weights, optimizer states and step count.
    n_iter : int
        The completed epochs (``n_iter_``).
    train_losses, validation_losses : list of float
        The loss history (``train_losses_``, ``validation_losses_``).
    lr_signature : str or None
        ``repr`` of the learning rate that trained it (a continued fit must use the same).
    rng : numpy.random.Generator or None
        The shuffling generator as the next epoch finds it; None when the file recorded none.

    Attributes
    ----------
    state, n_iter, train_losses, validation_losses, lr_signature, rng
        As given.
    """

    state: TrainingState
    n_iter: int
    train_losses: list[float]
    validation_losses: list[float]
    lr_signature: str | None
    rng: np.random.Generator | None


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
        tmp = os.path.join(folder, f"{prefix}{secrets.token_hex(_TOKEN_BYTES)}.tmp")
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


#: random bytes in a temporary's name: ``<prefix><12 hex digits>.tmp``
_TOKEN_BYTES = 6


def _remove_stale_temporaries(folder: str, prefix: str) -> None:
    """Removes ``<prefix><12 hex digits>.tmp`` regular files (the names _create_temporary
    makes, never a user's ``.ort-train-notes.tmp``) last modified before this process started:
    a writer killed mid-write (SIGKILL, power loss) leaves its temporary behind, and no write
    still running in this process or any other started since can be that old."""
    if (folder, prefix) in _CLEANED:
        return
    _CLEANED.add((folder, prefix))
    own = re.compile(re.escape(prefix) + f"[0-9a-f]{{{2 * _TOKEN_BYTES}}}" + r"\.tmp")
    started = _process_start()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not own.fullmatch(entry.name):
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


# ---- TrainingProgress <-> file -----------------------------------------------------------------
def save_training(
    path: str | os.PathLike[str], progress: TrainingProgress, identity: Mapping[str, Any]
) -> None:
    """Writes a fit's progress to ``path`` atomically.

    Arrays go under positional keys (``w<i>`` for weight i, ``s<i>_<j>`` for its optimizer
    state j), everything else into the JSON meta document.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write.
    progress : TrainingProgress
        What to save.
    identity : mapping
        JSON values identifying the model and the run (``trainer``, ``fingerprint``,
        ``batch_size``, ``shuffle``, and the :func:`resume_record` of the fit), which
        :func:`check_checkpoint` compares when the file is read.
    """
    state = progress.state
    names = list(state.weights)
    arrays: dict[str, np.ndarray] = {}
    n_states = []
    for i, name in enumerate(names):
        arrays[f"w{i}"] = state.weights[name]
        opt = state.optimizer.get(name, [])
        n_states.append(len(opt))
        for j, value in enumerate(opt):
            arrays[f"s{i}_{j}"] = value
    meta = {
        **identity,
        "weights": names,
        "n_states": n_states,
        "n_steps": int(state.n_steps),
        "n_samples": int(state.n_samples),
        "n_iter_": int(progress.n_iter),
        "train_losses_": [float(v) for v in progress.train_losses],
        "validation_losses_": [float(v) for v in progress.validation_losses],
        "lr_signature": progress.lr_signature,
        "rng": None if progress.rng is None else _jsonable(progress.rng.bit_generator.state),
    }
    write_checkpoint(path, arrays, meta)


def load_training(
    path: str, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], initial: TrainingState
) -> TrainingProgress:
    """The progress a checkpoint holds, every value checked before anything is returned.

    Parameters
    ----------
    path : str
        The file's name, for the messages.
    arrays, meta : mapping
        What :func:`read_checkpoint` returned.
    initial : TrainingState
        The trainer's initial state: the names, shapes and dtypes the weights must have.

    Returns
    -------
    TrainingProgress
        The saved progress (new arrays).

    Raises
    ------
    ValueError
        Other weights, shapes or dtypes, NaN or inf, counts that are not whole numbers in
        [0, 2**62], losses that are not numbers, an unknown or invalid random generator.
    KeyError, TypeError, IndexError
        A malformed document (the trainer reports them as a ValueError naming the file).
    """
    names = list(meta["weights"])
    if names != list(initial.weights):
        raise ValueError(f"{path} holds weights {names} but this trainer trains {list(initial.weights)}")
    weights: dict[str, np.ndarray] = {}
    optimizer: dict[str, list[np.ndarray]] = {}
    for i, name in enumerate(names):
        ref = initial.weights[name]
        weights[name] = _checked(path, name, arrays[f"w{i}"], ref)
        n_states = _count(path, "n_states", meta["n_states"][i])
        states = [_checked(path, name, arrays[f"s{i}_{j}"], ref) for j in range(n_states)]
        if states:
            optimizer[name] = states
    n_steps, n_iter = _count(path, "n_steps", meta["n_steps"]), _count(path, "n_iter_", meta["n_iter_"])
    # checkpoints written before per-sample schedules hold no sample count
    n_samples = _count(path, "n_samples", meta.get("n_samples", 0))
    signature = meta.get("lr_signature")
    return TrainingProgress(
        TrainingState(weights, optimizer, n_steps, n_samples),
        n_iter,
        _losses(path, "train_losses_", meta["train_losses_"]),
        _losses(path, "validation_losses_", meta["validation_losses_"]),
        None if signature is None else str(signature),
        None if meta.get("rng") is None else _generator(path, _from_jsonable(meta["rng"])),
    )


#: the largest count a checkpoint may hold: steps and samples fed to int64 graph inputs
_MAX_COUNT = 2**62


def _count(path: str, key: str, value: Any) -> int:
    """A counter of the JSON document: a whole number in [0, 2**62], else a ValueError naming
    the file and the key (an inf, a string or 10**30 came from a damaged or edited file)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        what = "a negative count" if isinstance(value, int) and value < 0 else "not a count"
        raise ValueError(
            f"{path} holds {key}={value!r}, which is {what} (a whole number from 0 to 2**62): "
            "a damaged or edited checkpoint; start over without it"
        )
    return value


def _losses(path: str, key: str, values: Any) -> list[float]:
    """A loss history of the JSON document: a list of numbers (NaN and inf are losses too)."""
    if not isinstance(values, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
    ):
        raise ValueError(
            f"{path} holds {key}={str(values)[:80]}, which is not a list of numbers: a damaged or "
            "edited checkpoint; start over without it"
        )
    return [float(v) for v in values]


_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def _generator(path: str, state: Any) -> np.random.Generator:
    """A generator in the saved state of a bit generator numpy names in _BIT_GENERATORS."""
    kind = state["bit_generator"]
    if kind not in _BIT_GENERATORS:  # the file names a class: never let it name any callable
        raise ValueError(f"{path}: unknown random bit generator {kind!r}")
    rng = np.random.Generator(getattr(np.random, kind)())
    try:
        rng.bit_generator.state = state
    except (ValueError, TypeError, OverflowError) as exc:  # OverflowError: a state of 10**100
        raise ValueError(f"{path}: invalid random generator state (rng): {exc}") from exc
    return rng


def _checked(path: str, name: str, value: np.ndarray, ref: np.ndarray) -> np.ndarray:
    if value.shape != ref.shape or value.dtype != ref.dtype:
        raise ValueError(
            f"{path}: weight {name!r} has shape {value.shape} and dtype {value.dtype}, the model's "
            f"{ref.shape} and {ref.dtype}"
        )
    if not np.isfinite(value).all():
        raise ValueError(f"{path}: weight {name!r} or its optimizer state holds NaN or inf")
    return np.array(value, copy=True)


def _jsonable(value: Any) -> Any:
    """A bit generator's state as JSON (PCG64's is ints already; MT19937's holds an array)."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.integer):
        return int(value)
    return value


def _from_jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=value["dtype"])
        return {k: _from_jsonable(v) for k, v in value.items()}
    return value


# ---- which model and run wrote a checkpoint ----------------------------------------------------
#: the prefix of a data fingerprint that hashes every value; an earlier version wrote a bare
#: sha256 of 64 evenly spaced rows, which :func:`check_checkpoint` can no longer compare
FINGERPRINT_SCHEME = "sha256-all:"
#: bytes hashed at a time: no copy of the data, however large
_HASH_CHUNK = 1 << 20


def data_fingerprint(arrays: Sequence[Any]) -> str:
    """sha256 of each array's shape, dtype and every value, streamed in 1 MiB chunks.

    About 35 ms for a 100 000 x 50 float32 array (20 MB) on one core, once per fit: an epoch
    of it takes 450 ms at the default batch size of 10. A sparse matrix hashes its canonical
    CSR arrays (the same matrix with its entries in another order gives the same digest; the
    same values dense give another).

    Parameters
    ----------
    arrays : sequence of numpy.ndarray, scipy.sparse CSR matrix or None
        X, y and sample weights as the fit trains on them (validated and cast), None for an
        absent one.

    Returns
    -------
    str
        ``'sha256-all:'`` and a hex digest; equal data give equal digests in any process.
    """
    digest = hashlib.sha256()
    for a in arrays:
        if a is None:
            digest.update(b"none;")
            continue
        digest.update(f"{a.shape};{a.dtype.str};".encode())
        if is_padded(a):  # the padded-row form of a CSR matrix: that matrix, and which part
            digest.update(f"padded {a.part};".encode())
            a = a.csr
        if is_sparse(a):
            csr = a if a.has_canonical_format else a.tocsr(copy=True)
            csr.sum_duplicates()  # sorts each row's indices (on the copy when not canonical)
            digest.update(b"csr;")
            for part in (csr.indptr, csr.indices, csr.data):
                _hash_array(digest, part)
        else:
            _hash_array(digest, a)
    return FINGERPRINT_SCHEME + digest.hexdigest()


def _hash_array(digest: Any, a: np.ndarray) -> None:
    """Feeds ``a``'s bytes to ``digest`` chunk by chunk (a view: no copy of C-contiguous data)."""
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    for k in range(0, flat.size, _HASH_CHUNK):
        digest.update(flat[k : k + _HASH_CHUNK])


def resume_record(
    batch_size: int,
    shuffle: bool,
    random_state: Any,
    data: Sequence[np.ndarray | None] | None,
    validation: Sequence[np.ndarray | None] | None,
) -> dict[str, Any]:
    """What decides the weights a fit ends at besides the model and the learning rate: the
    batches' size, order and seed, and the data, fingerprinted cheaply. A checkpoint records
    it; ``resume`` refuses one that differs.

    Parameters
    ----------
    batch_size : int
        The trainer's ``batch_size``.
    shuffle : bool
        The trainer's ``shuffle``.
    random_state : int, numpy.random.Generator, SeedSequence or None
        The trainer's ``random_state``.
    data : sequence of numpy.ndarray or None, or None
        X, y and sample weights as the fit trains on them (validated and cast); None: the data
        are not fingerprinted (a fit without checkpoints), and neither data key is recorded.
    validation : sequence of numpy.ndarray or None, or None
        The validation arrays likewise, None without validation data.

    Returns
    -------
    dict
        JSON values by key: ``batch_size``, ``shuffle``, ``random_state``, ``data``,
        ``validation_data``.
    """
    record = {
        "batch_size": int(batch_size),
        "shuffle": bool(shuffle),
        "random_state": _seed_record(random_state),
    }
    if data is not None:
        record["data"] = data_fingerprint(data)
        record["validation_data"] = None if validation is None else data_fingerprint(validation)
    return record


def _seed_record(random_state: Any) -> int | str | None:
    """random_state as JSON: an int or None as is; a Generator or SeedSequence by its type
    (not comparable across processes: only its kind is checked)."""
    if random_state is None or isinstance(random_state, (int, np.integer)):
        return None if random_state is None else int(random_state)
    return f"<{type(random_state).__name__}>"


def check_checkpoint(
    path: str, meta: Mapping[str, Any], fingerprint: str, record: Mapping[str, Any] | None = None
) -> list[str]:
    """Refuses a checkpoint of another model and, for ``resume``, one of another run.

    Parameters
    ----------
    path : str
        The file's name, for the messages.
    meta : mapping
        The checkpoint's JSON document.
    fingerprint : str
        The graph fingerprint of the trainer that reads it.
    record : mapping or None
        This fit's :func:`resume_record` when resuming; None when only loading.

    Returns
    -------
    list of str
        The keys of ``record`` the checkpoint does not hold (one written by an earlier version
        of ort-train); the caller warns that they could not be checked.

    Raises
    ------
    ValueError
        The checkpoint is one of another graph or loss.
    CheckpointMismatchError
        It was written with another setting or other data than ``record``.
    """
    if meta["fingerprint"] != fingerprint:
        raise ValueError(
            f"{path} is a checkpoint of another model (trainer {meta.get('trainer')!r}, graph "
            f"fingerprint {str(meta['fingerprint'])[:12]}..., this one {fingerprint[:12]}...): "
            "load it into a trainer built from the same graph and loss"
        )
    if record is None:
        return []
    unchecked = [k for k in record if k not in meta]
    for key, given in record.items():
        if key not in meta or meta[key] == given:
            continue
        if _sampled_fingerprint(meta[key]) and isinstance(given, str):
            # decided: resumable (its run's data may well be these), said in the warning
            unchecked.append(f"{key} (its fingerprint of 64 sampled rows)")
            continue
        raise _mismatch(path, key, meta[key], given)
    return unchecked


def _sampled_fingerprint(saved: Any) -> bool:
    """Whether a checkpoint's data fingerprint is an earlier version's hash of 64 sampled rows,
    which the hash of every value cannot be compared with."""
    return isinstance(saved, str) and not saved.startswith(FINGERPRINT_SCHEME)


#: how a resume mismatch is told: the parameter, and the fix
_RESUME_FIXES = {
    "batch_size": "resume with the same batch_size",
    "shuffle": "resume with the same shuffle",
    "random_state": "resume with the same random_state",
    "data": "resume with the same X, y and sample_weight",
    "validation_data": "resume with the same X_val, y_val and sample_weight_val",
}


def _mismatch(path: str, key: str, saved: Any, given: Any) -> CheckpointMismatchError:
    if key in ("data", "validation_data"):
        what = "other data" if key == "data" else "other validation data (X_val, y_val)"
        problem = f"was written by a fit on {what} than this one"
    else:
        problem = f"was written with {key}={saved!r}, this fit has {key}={given!r}"
    return CheckpointMismatchError(
        f"{path} {problem}: resuming would not end at the weights of the interrupted run; "
        f"{_RESUME_FIXES[key]}, or fit() to start over",
        key,
        saved,
        given,
    )


def warn_unchecked(path: str, missing: Sequence[str], stacklevel: int) -> None:
    """Warns that a checkpoint of an earlier version could not be checked for ``missing``.

    Parameters
    ----------
    path : str
        The checkpoint.
    missing : sequence of str
        What :func:`check_checkpoint` returned; nothing is said when it is empty.
    stacklevel : int
        ``warnings.warn``'s, counted from the caller of this function.
    """
    if missing:
        warnings.warn(
            f"{path} was written by an earlier version of ort-train, which did not record "
            f"{list(missing)} in the form this one checks: they could not be checked; resuming, "
            "give the interrupted run's data and settings",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


# ---- the writer a fit with checkpoint_dir runs -------------------------------------------------
class CheckpointWriter(Callback):
    """Writes a trainer's progress to ``path`` every ``every`` completed epochs and when the fit
    ends, however it ends (the last epoch, early stopping, Ctrl-C, a divergence, an error).

    The file always holds the end of a complete epoch: a Ctrl-C in the middle of one saves the
    end of the previous one, so that a resumed fit ends at the weights of an uninterrupted one.
    The trainer runs it before every other callback, so that they find the epoch's checkpoint
    written.

    Parameters
    ----------
    path : str
        The checkpoint file (``checkpoint_dir/checkpoint.npz``).
    every : int
        Epochs between two writes.

    Attributes
    ----------
    path, every
        As given.
    """

    def __init__(self, path: str, every: int) -> None:
        self.path = path
        self.every = every
        self._last: _EpochEnd | None = None
        self._written = -1

    def on_train_begin(self, trainer: BaseOrtTrainer, n_epochs: int) -> None:
        self._written = -1
        self._remember(trainer)

    def on_epoch_end(self, trainer: BaseOrtTrainer, epoch: int, logs: dict[str, float]) -> bool:
        self._remember(trainer)
        if trainer.n_iter_ % self.every == 0:
            self._write(trainer)
        return False

    def on_train_end(self, trainer: BaseOrtTrainer) -> None:
        if self._last is not None and trainer.n_iter_ < self._last.n_iter:
            # a divergence rolled back past the last epoch end (its weights gave the inf loss):
            # the file holds the state the trainer kept, not the one it condemned
            self._remember(trainer)
            self._written = -1
        if self._last is not None and self._written != self._last.n_iter:
            self._write(trainer)

    def _remember(self, trainer: BaseOrtTrainer) -> None:
        """Where the trainer is now, at the end of an epoch (or the start of the fit): the loop
        goes on changing the trainer, not what is kept here."""
        self._last = _EpochEnd(
            trainer._state,  # a new object at each epoch end, never changed in place
            trainer.n_iter_,
            len(trainer.train_losses_),
            len(trainer.validation_losses_),
            copy.deepcopy(trainer._rng),
        )

    def _write(self, trainer: BaseOrtTrainer) -> None:
        last = self._last
        assert last is not None
        progress = TrainingProgress(
            last.state,
            last.n_iter,
            trainer.train_losses_[: last.n_train],  # the histories only grow during a fit
            trainer.validation_losses_[: last.n_validation],
            trainer._lr_signature,
            last.rng,
        )
        save_training(self.path, progress, trainer._checkpoint_identity())
        self._written = last.n_iter


@dataclass
class _EpochEnd:
    state: TrainingState
    n_iter: int
    n_train: int
    n_validation: int
    rng: np.random.Generator
