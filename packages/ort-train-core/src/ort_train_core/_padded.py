"""A CSR matrix in padded-row (ELL) form, made batch by batch: a graph that reads a sparse X as
two dense inputs (each row's stored values, and their column indices) trains on it in
O(stored values) without the whole padded form in memory."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

#: widths up to this read each row's slot mask from a table of one row per length (a gather
#: of ``width`` bytes a row instead of a comparison per slot); wider ones compare
MASK_TABLE_MAX_WIDTH = 512


class _Rows(NamedTuple):
    """Where some rows' stored values start, read through the windows (see :class:`_Slots`)."""

    #: each row's first stored value, lowered to the last window for the tail rows
    windows: np.ndarray
    #: the rows (positions in the selection) whose window would run past the data: their
    #: slots are taken one by one
    tail: np.ndarray
    #: the tail rows' slots: stored value ``start + j`` (clipped to the data when taken)
    tail_slots: np.ndarray
    #: True on the slots holding the row's own values (the others are zeroed in the values)
    valid: np.ndarray


class _Slots:
    """Where some rows' stored values are, shared by the pair. Slot ``j`` of a row reads stored
    value ``start + j``: the ``width`` values from ``start`` are a window of the data, so the
    rows are a gather of whole windows from a strided view (one row copy each, instead of an
    index per slot); beyond the row's end a window reads its neighbours' values, which the
    values zero. The batch store fills the values then the columns with the same rows (two
    views of one order array): the second call reuses the first's work when it reads the same
    memory, once."""

    def __init__(self, indptr: np.ndarray, width: int, stored: int) -> None:
        # int64 throughout: mixed types take 1.4x longer
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.positions = np.arange(width, dtype=np.int64)
        #: the last window's start: rows starting beyond it are the tail (-1: no window fits)
        self.last_window = stored - width
        self._valid_by_length = (
            self.positions < np.arange(width + 1)[:, None] if width <= MASK_TABLE_MAX_WIDTH else None
        )
        #: the rows whose work the cache holds, kept alive (their memory is not reused) until
        #: the next call reuses it or computes another
        self._pending: tuple[np.ndarray | slice, _Rows] | None = None

    def of(self, rows: np.ndarray | slice) -> _Rows:
        """The windows, tail and slot mask of ``rows`` (indices, or a slice of step 1)."""
        pending, self._pending = self._pending, None
        if pending is not None and _same_rows(pending[0], rows):
            return pending[1]
        if isinstance(rows, slice):
            starts, ends = self.indptr[rows], self.indptr[rows.start + 1 : rows.stop + 1]
        else:
            starts, ends = self.indptr[rows], self.indptr[rows + 1]
        lengths = ends - starts
        table = self._valid_by_length
        valid = table[lengths] if table is not None else self.positions < lengths[:, None]
        tail = np.flatnonzero(starts > self.last_window)
        found = _Rows(
            np.minimum(starts, max(self.last_window, 0)),
            tail,
            starts[tail, None] + self.positions,
            valid,
        )
        self._pending = (rows, found)
        return found


def _same_rows(a: np.ndarray | slice, b: np.ndarray | slice) -> bool:
    """Whether two row selections are the same slice, or arrays viewing the same memory the
    same way."""
    if isinstance(a, slice) or isinstance(b, slice):
        return a == b
    return bool(
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.shape == b.shape
        and a.strides == b.strides
        and a.dtype == b.dtype
    )


class PaddedRows:
    """One of the two arrays of a CSR matrix's padded-row form, of shape ``(n_rows, width)``:
    row ``i`` of ``part='values'`` holds row ``i``'s stored values then zeros; of
    ``part='columns'``, their column indices then valid indices (of other stored values: a
    zero value times any weight adds nothing, and its gradient is zero).

    The fit's batches gather their rows with :meth:`rows_into` (core's batch store treats it
    as it treats a sparse matrix, densifying one batch at a time): the padded form, ``width``
    times the rows, never exists whole. Make the pair with :func:`padded_rows`.

    Parameters
    ----------
    csr : scipy.sparse CSR matrix
        The matrix, its values finite and in the float type of the graph's input (not
        copied).
    part : {'values', 'columns'}
        Which array this is: its dtype is the matrix's values' or its column indices'.
    slots : _Slots
        The slot map the pair shares.
    dtype : numpy.dtype, optional
        The values' type, their rows cast as they are gathered (a float64 matrix feeds a
        float32 graph without a float32 copy of its values); default: the stored values'.
        The columns keep the indices' type.
    """

    def __init__(self, csr: Any, part: str, slots: _Slots, dtype: Any = None) -> None:
        if part not in ("values", "columns"):
            raise ValueError(f"part must be 'values' or 'columns', got {part!r}")
        self.csr = csr
        self.part = part
        self._slots = slots
        self._source: np.ndarray = csr.data if part == "values" else csr.indices
        self.dtype = np.dtype(self._source.dtype if dtype is None or part == "columns" else dtype)
        self.width = len(slots.positions)
        size, step = self._source.size, self._source.strides[0]
        #: window ``k`` is the ``width`` stored values from ``k`` (a read-only view, no copy);
        #: None when fewer values than ``width`` are stored
        self._windows = (
            as_strided(self._source, (size - self.width + 1, self.width), (step, step), writeable=False)
            if size >= self.width
            else None
        )
        self.shape = (int(csr.shape[0]), self.width)
        self.ndim = 2

    @property
    def nbytes(self) -> int:
        """The bytes the whole array would take (it is never made whole)."""
        return int(self.shape[0] * self.width * self.dtype.itemsize)

    def rows_into(self, rows: np.ndarray | slice, out: np.ndarray) -> None:
        """Writes the padded form of ``rows`` into ``out`` (``(len(rows), width)``, this
        array's dtype).

        Parameters
        ----------
        rows : numpy.ndarray of int or slice
            The rows, in the order to write them.
        out : numpy.ndarray
            The destination.
        """
        self._padded(rows, out)

    def rows(self, rows: np.ndarray | slice) -> np.ndarray:
        """The padded form of ``rows`` as a new array.

        Parameters
        ----------
        rows : numpy.ndarray of int or slice
            The rows.

        Returns
        -------
        numpy.ndarray
            Shape ``(len(rows), width)``.
        """
        return self._padded(rows, None)

    def _padded(self, rows: np.ndarray | slice, out: np.ndarray | None) -> np.ndarray:
        """The padded form of ``rows``, written into ``out`` or (None) a new array."""
        if isinstance(rows, slice):
            start, stop, step = rows.indices(self.shape[0])
            rows = slice(start, max(start, stop)) if step == 1 else np.arange(start, stop, step)
        if self._source.size == 0:
            n = rows.stop - rows.start if isinstance(rows, slice) else len(rows)
            if out is None:
                return np.zeros((n, self.width), self.dtype)
            out[...] = 0
            return out
        found = self._slots.of(rows)
        if self._windows is None:  # fewer stored values than a window: every row is the tail
            block = np.empty(found.valid.shape, self.dtype) if out is None else out
        elif out is None:
            block = self._windows[found.windows].astype(self.dtype, copy=False)
        else:
            block = out
            block[...] = self._windows[found.windows]
        if found.tail.size:
            # mode='clip': the last row's slots read past the data (the default 'raise' copies)
            block[found.tail] = np.take(self._source, found.tail_slots, mode="clip")
        if self.part == "values":
            # the neighbours' values beyond each row's end times False: 0 (they are finite)
            np.multiply(block, found.valid, out=block)
        return block


def padded_rows(csr: Any, width: int | None = None, dtype: Any = None) -> tuple[PaddedRows, PaddedRows]:
    """The padded-row form of a CSR matrix: its values and their column indices, each an
    array of shape ``(n_rows, width)`` made batch by batch.

    Parameters
    ----------
    csr : scipy.sparse CSR matrix
        The matrix, its values finite; the columns take the type of its indices (int32, or
        int64 for large matrices).
    width : int, optional
        Slots per row, at least the longest row's stored values; default: that (at least 1).
    dtype : numpy.dtype, optional
        The graph's float type, when the stored values are in another: each batch's rows are
        cast as they are gathered, the values never copied whole; default: theirs.

    Returns
    -------
    (PaddedRows, PaddedRows)
        The values and the columns, to feed the graph's two inputs.
    """
    longest = int(np.diff(csr.indptr).max()) if csr.shape[0] else 0
    if width is None:
        width = max(1, longest)
    if width < max(1, longest):
        raise ValueError(f"width {width} is below the longest row's {longest} stored values (and 1)")
    slots = _Slots(csr.indptr, int(width), int(csr.data.shape[0]))
    return PaddedRows(csr, "values", slots, dtype), PaddedRows(csr, "columns", slots)


def is_padded(value: Any) -> bool:
    """Whether ``value`` is a :class:`PaddedRows`."""
    return isinstance(value, PaddedRows)
