"""Reading ``.npz`` files (data files and checkpoints) that may be truncated, corrupted or
crafted.

``numpy.load`` trusts an archive: a truncated one raises ``zipfile.BadZipFile``, a member without
a ``.npy`` header comes back as ``bytes`` (an AttributeError later), and a header that declares
10**12 elements makes numpy allocate them before it reads a byte. :func:`read_npz` parses each
member's header itself, refuses a size its bytes cannot hold, reads the data incrementally (the
memory used grows with the bytes that really arrive, never with what a header claims) and turns
every failure into a :class:`ValueError` that names the file and the array.
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from typing import IO

import numpy as np

__all__ = ["read_npz", "write_npz"]

#: what the zip and npy readers raise on damaged input: truncation (EOFError, BadZipFile),
#: a corrupt deflate stream (zlib.error), encrypted or exotic members (RuntimeError,
#: NotImplementedError), an unparsable header (ValueError)
_READ_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    OSError,
    EOFError,
    ValueError,
    RuntimeError,
    NotImplementedError,
    zlib.error,
)

#: bytes read per chunk: the buffer grows with the data that really arrive
_CHUNK = 1 << 24


def write_npz(f: IO[bytes], arrays: dict[str, np.ndarray]) -> None:
    """Writes ``arrays`` as an ``.npz`` archive (what ``numpy.load`` reads) to the binary file
    ``f``, one ``<name>.npy`` member per array: unlike ``numpy.savez(f, **arrays)``, any name is
    taken, ``file`` and ``allow_pickle`` (savez's own arguments) too.

    Parameters
    ----------
    f : binary file object
        Where the archive goes.
    arrays : dict of str to ndarray
        The arrays by name.
    """
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


class _BadMember(ValueError):
    """A member that is not a valid .npy array (the message says why)."""


def read_npz(path: str | os.PathLike[str], kind: str = ".npz file") -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` archive by name (``.npy`` suffix removed), without pickle.

    Parameters
    ----------
    path : str or os.PathLike
        The archive.
    kind : str
        What the file should be, for the messages (``".npz file"``, ``"checkpoint"``).

    Returns
    -------
    dict of str to numpy.ndarray
        Writable arrays, in the archive's order.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        Naming the file (and the array) when it is not a zip archive, is truncated or
        corrupted, holds the same name twice, a member without a ``.npy`` header, pickled
        objects, or a header declaring more data than the member holds.
    """
    path = os.fspath(path)
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise
    except _READ_ERRORS as exc:
        raise ValueError(f"{path} is not a readable {kind} (not a complete zip archive: {exc})") from exc
    arrays: dict[str, np.ndarray] = {}
    # the memory the arrays may take, all together: a compressed archive's headers can declare
    # a thousand times its size, which numpy would allocate and fail on with a MemoryError
    budget = memory_available()
    with archive:
        for info in archive.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if name in arrays:
                raise ValueError(f"{path} is not a readable {kind}: it holds the array {name!r} twice")
            try:
                with archive.open(info) as member:
                    arrays[name] = _read_member(member, info.file_size, budget)
                if budget is not None:
                    budget -= arrays[name].nbytes
            except _BadMember as exc:
                raise ValueError(f"{path} is not a readable {kind}: array {name!r} {exc}") from exc
            except MemoryError as exc:  # memory another process took while reading
                raise ValueError(f"{path}: not enough memory to read its array {name!r}") from exc
            except _READ_ERRORS as exc:
                raise ValueError(
                    f"{path} is not a readable {kind}: array {name!r} cannot be read (the file is "
                    f"truncated or corrupted: {exc})"
                ) from exc
    return arrays


def memory_available() -> int | None:
    """The bytes of memory a read may still take (Linux's MemAvailable); None where unknown.

    Returns
    -------
    int or None
        The available memory in bytes, None when the system does not tell it.
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


def _read_member(member: IO[bytes], member_size: int, budget: int | None = None) -> np.ndarray:
    """One ``.npy`` member: header checked against the member's size and the memory ``budget``
    (bytes, None for no limit), then its data."""
    try:
        version = np.lib.format.read_magic(member)
    except ValueError as exc:
        raise _BadMember(f"is not a .npy array (no .npy header: {exc})") from exc
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(member)
    else:  # 3.0 only exists for structured types with non-latin-1 field names
        raise _BadMember(f"has .npy format version {version}; numeric arrays are version 1.0 or 2.0")
    if dtype.hasobject:
        raise _BadMember(f"holds Python objects (dtype {dtype}), which are never unpickled; save numbers")
    if any(d < 0 for d in shape):
        raise _BadMember(f"declares the negative shape {shape}")
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    available = member_size - member.tell()
    if nbytes > available:
        raise _BadMember(
            f"declares shape {shape} of {dtype} ({nbytes} bytes) but its member holds {max(available, 0)} "
            "bytes (a truncated or forged file)"
        )
    if budget is not None and nbytes > budget:
        raise _BadMember(
            f"declares shape {shape} of {dtype} ({_mib(nbytes)}), more than the {_mib(max(budget, 0))} of "
            "memory available; free memory, or use a smaller file"
        )
    data = bytearray()
    while len(data) < nbytes:
        block = member.read(min(_CHUNK, nbytes - len(data)))
        if not block:
            raise _BadMember(f"is truncated: {len(data)} of the {nbytes} bytes its header declares")
        data += block
    member.read(1)  # reaching the end makes zipfile check the member's CRC
    flat = np.frombuffer(data, dtype=dtype)  # a bytearray: the array is writable
    return flat.reshape(shape, order="F" if fortran_order else "C")
