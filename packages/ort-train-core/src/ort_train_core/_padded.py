"""A CSR matrix in padded-row (ELL) form, made batch by batch: a graph that reads a sparse X as
two dense inputs (each row's stored values, and their column indices) trains on it in
O(stored values) without the whole padded form in memory."""

from __future__ import annotations

from typing import Any

import numpy as np


class _Slots:
    """Which stored value each slot of some rows reads, and which slots are padding, in
    buffers reused from batch to batch. The batch store fills the values then the columns
    with the same rows (two views of one order array): the second call reuses the first's
    map when it reads the same memory, once."""

    def __init__(self, indptr: np.ndarray, width: int) -> None:
        self.indptr = indptr
        self.positions = np.arange(width, dtype=np.int64)
        self._buffers: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        #: the rows whose map the buffers hold, kept alive (their memory is not reused) until
        #: the next call reuses it or computes another
        self._pending: np.ndarray | slice | None = None

    def of(self, rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """(slots, padding) of shape ``(len(rows), width)``: slot ``j`` of a row reads stored
        value ``start + j`` (beyond the row's end, a neighbour's: clipped to the data when
        taken); ``padding`` marks the slots beyond the row's end. ``rows``: indices, or a
        slice of step 1."""
        if isinstance(rows, slice):
            starts, ends = self.indptr[rows], self.indptr[rows.start + 1 : rows.stop + 1]
        else:
            starts, ends = self.indptr[rows], self.indptr[rows + 1]
        n = len(starts)
        if n not in self._buffers:
            shape = (n, len(self.positions))
            self._buffers[n] = (np.empty(shape, np.int64), np.empty(shape, np.bool_))
        slots, padding = self._buffers[n]
        pending, self._pending = self._pending, None
        if pending is not None and _same_rows(pending, rows):
            return slots, padding
        starts = starts.astype(np.int64)  # int64 throughout: mixed types take 1.4x longer
        np.add(starts[:, None], self.positions, out=slots)
        np.greater_equal(self.positions, (ends - starts)[:, None], out=padding)
        self._pending = rows
        return slots, padding


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
        The matrix, its values in the float type of the graph's input (not copied).
    part : {'values', 'columns'}
        Which array this is: its dtype is the matrix's values' or its column indices'.
    slots : _Slots
        The slot map the pair shares.
    """

    def __init__(self, csr: Any, part: str, slots: _Slots) -> None:
        if part not in ("values", "columns"):
            raise ValueError(f"part must be 'values' or 'columns', got {part!r}")
        self.csr = csr
        self.part = part
        self._slots = slots
        self._source: np.ndarray = csr.data if part == "values" else csr.indices
        self.dtype = self._source.dtype
        self.width = len(slots.positions)
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
        if isinstance(rows, slice):
            start, stop, step = rows.indices(self.shape[0])
            rows = slice(start, max(start, stop)) if step == 1 else np.arange(start, stop, step)
        if self._source.size == 0:
            out[...] = 0
            return
        slots, padding = self._slots.of(rows)
        # mode='clip': the last row's padding reads the last stored value (the default 'raise'
        # also copies: 2x slower)
        np.take(self._source, slots, out=out, mode="clip")
        if self.part == "values":
            np.copyto(out, 0, where=padding)

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
        n = len(range(*rows.indices(self.shape[0]))) if isinstance(rows, slice) else len(rows)
        out = np.empty((n, self.width), dtype=self.dtype)
        self.rows_into(rows, out)
        return out


def padded_rows(csr: Any, width: int | None = None) -> tuple[PaddedRows, PaddedRows]:
    """The padded-row form of a CSR matrix: its values and their column indices, each an
    array of shape ``(n_rows, width)`` made batch by batch.

    Parameters
    ----------
    csr : scipy.sparse CSR matrix
        The matrix, its values in the graph's float type; the columns take the type of its
        indices (int32, or int64 for large matrices).
    width : int, optional
        Slots per row, at least the longest row's stored values; default: that (at least 1).

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
    slots = _Slots(csr.indptr, int(width))
    return PaddedRows(csr, "values", slots), PaddedRows(csr, "columns", slots)


def is_padded(value: Any) -> bool:
    """Whether ``value`` is a :class:`PaddedRows`."""
    return isinstance(value, PaddedRows)
