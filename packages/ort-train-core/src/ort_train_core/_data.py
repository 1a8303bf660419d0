"""Input validation and the device-resident batches of one fit."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._binding import DeviceArray
from ._padded import PaddedRows, is_padded
from ._runtime import Device, ort_capi


@dataclass(frozen=True)
class FeatureSpec:
    """One batched input of the graph: its name, element type and declared dims (None where
    free; the first, the batch, is never checked)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | None, ...] | None

    def describe(self) -> str:
        """The shape the input expects, as ``(n, 3, ?, ?)``."""
        if self.dims is None:
            return "(n, ...)"
        return "(" + ", ".join(["n", *(str(d) if d is not None else "?" for d in self.dims[1:])]) + ")"


@dataclass
class DataSpec:
    """What the graph expects: its batched inputs (features), the label's dtype and layout,
    whether it takes sample weights (in ``weight_dtype``)."""

    features: tuple[FeatureSpec, ...]
    label_dtype: np.dtype
    label_tail: tuple[int | None, ...]
    has_weight: bool
    n_classes: int | None = None
    weight_dtype: np.dtype = field(default_factory=lambda: np.dtype(np.float32))


def feature_spec(vi: Any) -> FeatureSpec:
    """The FeatureSpec of a graph input (a ``ValueInfoProto``).

    Parameters
    ----------
    vi : onnx.ValueInfoProto
        The input.

    Returns
    -------
    FeatureSpec
        Its name, numpy dtype and dims (None when the graph declares no shape).
    """
    from onnx import helper

    tt = vi.type.tensor_type
    dims = (
        tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        if tt.HasField("shape")
        else None
    )
    return FeatureSpec(vi.name, np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)), dims)


def is_sparse(value: Any) -> bool:
    """Whether ``value`` is a scipy.sparse matrix or array (scipy is not imported for that)."""
    return type(value).__module__.startswith("scipy.sparse") and hasattr(value, "tocsr")


def dense_rows(arr: Any, rows: np.ndarray | slice) -> np.ndarray:
    """``arr[rows]`` as a dense array: a sparse matrix densifies only these rows, a
    :class:`PaddedRows` pads only these."""
    if is_padded(arr):
        padded: np.ndarray = arr.rows(rows)
        return padded
    if is_sparse(arr):
        out: np.ndarray = arr[rows].toarray()
        return out
    return np.asarray(arr[rows])


def _check_sparse(spec: FeatureSpec, value: Any, what: str) -> Any:
    """A sparse X as a CSR matrix in the input's float type, its stored values checked (finite,
    within the type's range): batches densify their rows only, memory O(batch)."""
    if spec.dims is not None and len(spec.dims) != 2:
        raise ValueError(
            f"{what} is a sparse matrix, which is 2-D, but the model's input {spec.name!r} has shape "
            f"{spec.describe()}"
        )
    if not np.issubdtype(spec.dtype, np.floating):
        raise TypeError(
            f"{what} is sparse but the model's input {spec.name!r} is {spec.dtype}: give a dense array"
        )
    csr = sparse_as(what, value, spec.dtype)
    if csr.shape[0] == 0:
        raise ValueError(f"{what} has no rows")
    want = spec.dims[1] if spec.dims is not None else None
    if want is not None and csr.shape[1] != want:
        raise ValueError(f"{what} has {csr.shape[1]} features but the model expects {want}")
    return csr


def check_sparse_structure(name: str, value: Any) -> None:
    """Refuses a sparse matrix whose index arrays are inconsistent, before native code reads them.

    scipy's row indexing, ``toarray`` and format conversions run C++ loops that trust
    ``indptr`` and ``indices``: an out-of-range column index is a segmentation fault, a
    decreasing ``indptr`` a heap corruption. CSR, CSC, BSR and COO are checked (O(nnz + rows));
    LIL, DOK and DIA keep Python-level structures whose CSR form :func:`sparse_as` checks.

    Parameters
    ----------
    name : str
        What the matrix is (``'X'``), for the message.
    value : scipy.sparse matrix or array
        The matrix.

    Raises
    ------
    ValueError
        Naming the first problem found: lengths of ``indptr``, ``indices`` and ``data``, where
        ``indptr`` starts, ends or decreases, an index outside the matrix.
    """
    fmt = getattr(value, "format", "")
    if fmt in ("csr", "csc", "bsr"):
        problem = _compressed_problem(value, fmt)
    elif fmt == "coo" and len(value.shape) == 2:
        problem = _coo_problem(value)
    else:
        return
    if problem:
        raise ValueError(
            f"{name} is a malformed sparse {fmt.upper()} matrix: {problem}; build it from consistent "
            "arrays (scipy's check_format(full_check=True) finds the same problem)"
        )


def _compressed_problem(value: Any, fmt: str) -> str | None:
    """What is wrong with a CSR/CSC/BSR matrix's ``indptr``/``indices``/``data``, or None."""
    rows, cols = value.shape
    axes = {"csr": ("row", "column"), "csc": ("column", "row"), "bsr": ("block row", "block column")}
    major_axis, minor_axis = axes[fmt]
    block = value.blocksize if fmt == "bsr" else (1, 1)
    major, minor = (rows // block[0], cols // block[1]) if fmt != "csc" else (cols, rows)
    indptr, indices = np.asarray(value.indptr), np.asarray(value.indices)
    stored = np.asarray(value.data).shape[0] if np.ndim(value.data) else 0
    if indptr.ndim != 1 or indptr.shape[0] != major + 1:
        need = f"a {fmt.upper()} matrix of {major} {major_axis}s needs {major + 1}"
        return f"indptr has {indptr.size} entries but {need}"
    if indices.ndim != 1 or indices.shape[0] != stored:
        return f"data has {stored} values but indices has {indices.size}"
    if indptr[0] != 0:
        return f"indptr starts at {indptr[0]}, not 0"
    if indptr[-1] != stored:
        return f"indptr ends at {indptr[-1]} but it stores {stored} values"
    down = np.flatnonzero(np.diff(indptr) < 0)
    if down.size:
        k = int(down[0]) + 1
        return f"indptr decreases at position {k} ({indptr[k - 1]} then {indptr[k]})"
    return _index_problem(indices, minor, minor_axis)


def _coo_problem(value: Any) -> str | None:
    """What is wrong with a COO matrix's ``row``/``col``/``data``, or None."""
    row, col, stored = np.asarray(value.row), np.asarray(value.col), np.asarray(value.data).size
    if row.size != stored or col.size != stored:
        return f"data has {stored} values but row has {row.size} and col {col.size}"
    return _index_problem(row, value.shape[0], "row") or _index_problem(col, value.shape[1], "column")


def _index_problem(indices: np.ndarray, n: int, axis: str) -> str | None:
    """The first index outside [0, n), named, or None."""
    if not indices.size:
        return None
    low, high = indices.min(), indices.max()
    if low >= 0 and high < n:
        return None
    bad = low if low < 0 else high
    return f"it holds {axis} index {bad} but it has {n} {axis}s (indices must lie in [0, {n}))"


def sparse_as(name: str, value: Any, dtype: np.dtype, checked: bool = False) -> Any:
    """A sparse matrix as CSR in ``dtype``, its stored values checked (numbers, finite, within
    the type's range). The caller's matrix is never modified: a CSR matrix already in ``dtype``
    is returned as it is, another gets new values sharing its index arrays.

    Parameters
    ----------
    name : str
        What the matrix is (``'X'``), for the error messages.
    value : scipy.sparse matrix or array
        Any format.
    dtype : numpy.dtype
        The float type of the values.
    checked : bool, default=False
        Whether the caller checked the structure (:func:`check_sparse_structure`) and that the
        values are finite numbers (scikit-learn's validation): only the cast, and its range
        check, are left (a predict's 5 000 rows: a third of the time).

    Returns
    -------
    scipy.sparse CSR matrix or array
        The values in ``dtype``.
    """
    if not checked:
        check_sparse_structure(name, value)  # before tocsr and the batches' row indexing read it
    csr = value.tocsr()  # ``value`` itself when it is CSR already
    if csr is not value and value.format not in ("csc", "bsr", "coo"):
        # LIL, DOK, DIA: only their CSR form has index arrays to check (the others were above)
        check_sparse_structure(name, csr)
    data = csr.data
    if not checked:
        data = _as_numeric(name, data)
        _check_finite(name, data)
    if data.dtype == dtype:
        return csr
    return type(csr)((cast_checked(name, data, dtype), csr.indices, csr.indptr), shape=csr.shape)


def _as_numeric(name: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        # np.asarray drops the mask: the masked (often garbage) values would be trained on
        raise TypeError(f"{name} is a masked array with masked values; fill them first (X.filled(...))")
    try:
        arr = np.asarray(value)
    except ValueError as exc:  # ragged nested lists
        raise ValueError(f"{name} is not a rectangular array of numbers: {exc}") from exc
    if arr.dtype.kind == "f":  # real floats, the usual case: none of np.issubdtype's 3 us tests
        return arr
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise TypeError(f"{name} must hold numbers, got dtype {arr.dtype}; convert it with astype(float)")
    if np.issubdtype(arr.dtype, np.timedelta64):  # numpy files timedelta64 under the integers
        raise TypeError(f"{name} holds durations (dtype {arr.dtype}); convert them to numbers first")
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise TypeError(f"{name} is complex; only real numbers can be trained on")
    return arr


def _all_finite(arr: np.ndarray) -> bool:
    """Whether a float array holds no NaN or inf, without np.isfinite's boolean temporary
    (a quarter of a float32 array's size): min and max propagate NaN, and an inf is one of them."""
    if arr.size == 0:
        return True
    with np.errstate(invalid="ignore"):
        return bool(np.isfinite(arr.min()) and np.isfinite(arr.max()))


def _count_non_finite(arr: np.ndarray) -> int:
    """The number of NaN/inf values (for the error message), counted in chunks."""
    flat = arr.reshape(-1)
    chunk = 1 << 20
    return sum(int(np.count_nonzero(~np.isfinite(flat[k : k + chunk]))) for k in range(0, flat.size, chunk))


def cast_checked(name: str, arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A C-contiguous copy (or view) in ``dtype``; values beyond its range are refused.

    A float64 1e39 becomes inf in float32 (numpy only warns): the loss would be inf from the
    first step and the fit would end in a ConvergenceError that blames the learning rate.

    Parameters
    ----------
    name : str
        What the array is (``'X'``, ``'sample_weight'``), for the error message.
    arr : ndarray
        The values.
    dtype : numpy.dtype
        The type to cast to.

    Returns
    -------
    ndarray
        ``arr`` in ``dtype``, C-contiguous.

    Raises
    ------
    ValueError
        When a finite value becomes inf or NaN in ``dtype``.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(arr, dtype=dtype)
    if out.dtype != arr.dtype and np.issubdtype(out.dtype, np.floating) and not _all_finite(out):
        bad = _count_non_finite(out)
        raise ValueError(
            f"{name} holds {bad} value(s) beyond the range of {dtype} (largest {np.finfo(dtype).max:.3g}), "
            f"the type the model computes in; scale the data"
        )
    warn_inexact_integers(name, arr, out)
    return out


def warn_inexact_integers(name: str, arr: np.ndarray, out: np.ndarray) -> None:
    """Warns when integers beyond 2**(mantissa bits + 1) lost their last digits in the cast to
    a float type (int64 ids or timestamps in float32): neighbouring values merge silently.

    Parameters
    ----------
    name : str
        What the array is (``'X'``), for the message.
    arr : numpy.ndarray
        The values as given; nothing is said unless they are integers.
    out : numpy.ndarray
        The same values cast to a float type, of ``arr``'s shape.
    """
    if arr.dtype.kind not in "iu" or out.dtype.kind != "f" or not arr.size:
        return
    bits = np.finfo(out.dtype).nmant + 1
    limit = 2**bits
    flat, cast = arr.reshape(-1), out.reshape(-1)
    large = (flat > limit) | (flat < -limit)
    if not large.any():
        return
    given = flat[large]
    info = np.iinfo(arr.dtype)
    top = np.float64(info.max)
    if int(top) > info.max:  # float64(2**63 - 1) is 2**63
        top = np.nextafter(top, 0)
    back = cast[large].astype(np.float64).clip(info.min, top).astype(arr.dtype)
    changed = np.flatnonzero(given != back)
    if changed.size:
        k = int(changed[0])
        warnings.warn(
            f"{name} holds {changed.size} integer(s) that {out.dtype} cannot hold exactly (beyond 2**{bits}: "
            f"{given[k]} becomes {back[k]}), the type the model computes in: neighbouring values merge. "
            "Scale them or subtract an offset; feed ids to an integer input (an embedding's) instead",
            UserWarning,
            stacklevel=4,
        )


def _check_finite(name: str, arr: np.ndarray) -> None:
    if arr.dtype.kind == "f" and not _all_finite(arr):  # kind 'f': np.floating's types
        bad = _count_non_finite(arr)
        raise ValueError(f"{name} contains {bad} NaN or infinite value(s); remove or impute them first")


def check_fit_arrays(
    spec: DataSpec, X: Any, y: Any, sample_weight: Any = None, prefix: str = ""
) -> list[np.ndarray | None]:
    """Validated C-contiguous copies (or views) in the graph's dtypes; never trains on garbage.

    Parameters
    ----------
    spec : DataSpec
        What the graph expects.
    X : array-like, dict of array-like, or tuple of array-like
        The features: one array of the input's rank for a graph with one batched input; for
        several, a dict ``{input name: array}`` or a tuple (or list) of arrays in the graph's
        input order. Every array has the same number of rows (first axis).
    y : array-like of shape (n_samples, ...)
        The labels: class indices for an integer label, else values of the label's shape.
    sample_weight : array-like of shape (n_samples,) or (n_samples, 1), optional
        Weights >= 0, not all zero; ones when the graph has a sample-weight input and none is
        given.
    prefix : str, optional
        Prepended to the names in the messages (``'validation '``).

    Returns
    -------
    list of numpy.ndarray or None
        The features in the graph's input order, then y, then the sample weights (None when
        the graph takes none): the order the batches feed them.

    Raises
    ------
    ValueError
        Wrong shapes or row counts, NaN or inf, values beyond the graph's dtype, fractions for
        an integer input, bad class indices or weights, a sample weight for a graph without one.
    TypeError
        Values that are not real numbers (strings, objects, complex, durations, masked), or
        features in a form that does not name the graph's inputs.
    """
    features = check_features(spec.features, X, prefix)
    n = features[0].shape[0]
    ya = _as_numeric(f"{prefix}y", y)
    if ya.ndim == 0 or ya.shape[0] != n:
        raise ValueError(f"{prefix}y has {ya.shape[0] if ya.ndim else 0} rows but X has {n}")
    _check_finite(f"{prefix}y", ya)
    if np.dtype(spec.label_dtype).kind in "iu":  # np.integer's types of a graph (3 us less)
        yc = _check_class_indices(spec, ya, prefix)
    else:
        yc = _check_label_values(spec, ya, prefix)
    if sample_weight is not None:
        return [*features, yc, _check_sample_weight(spec, sample_weight, n, prefix)]
    return [*features, yc, np.ones(n, dtype=spec.weight_dtype) if spec.has_weight else None]


def split_features(specs: tuple[FeatureSpec, ...], X: Any, prefix: str = "") -> list[tuple[FeatureSpec, Any]]:
    """Pairs each batched input with its array-like in ``X`` (one array, a dict by input name,
    or a tuple/list in input order)."""
    names = [f.name for f in specs]
    if is_sparse(X):  # before the dict test: a DOK matrix is a dict
        if len(specs) != 1:
            raise TypeError(
                f"{prefix}X is one sparse matrix but the model has {len(specs)} batched inputs {names}: "
                "give a dict {name: array}"
            )
        return [(specs[0], X)]
    if isinstance(X, dict):
        missing = [n for n in names if n not in X]
        extra = [k for k in X if k not in names]
        if missing or extra:
            detail = (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else "")
            raise ValueError(
                f"{prefix}X is a dict with keys {sorted(map(str, X))} but the model's batched inputs are "
                f"{names}{detail}"
            )
        return [(f, X[f.name]) for f in specs]
    if len(specs) == 1:
        return [(specs[0], X)]
    if isinstance(X, (tuple, list)) and len(X) == len(specs):
        return list(zip(specs, X))
    got = f"a {type(X).__name__} of {len(X)} items" if isinstance(X, (tuple, list)) else type(X).__name__
    raise TypeError(
        f"the model has {len(specs)} batched inputs {names}: give {prefix}X as a dict "
        f"{{name: array}} or a tuple of {len(specs)} arrays in that order, not {got}"
    )


def check_features(specs: tuple[FeatureSpec, ...], X: Any, prefix: str = "") -> list[np.ndarray]:
    """The arrays of the graph's batched inputs, checked (rank, fixed dims, finite, dtype range,
    equal row counts) and cast to each input's dtype, in the graph's input order.

    Parameters
    ----------
    specs : tuple of FeatureSpec
        The batched inputs.
    X : array-like, dict or tuple
        As :func:`check_fit_arrays`.
    prefix : str, optional
        Prepended to the names in the messages.

    Returns
    -------
    list of numpy.ndarray
        One C-contiguous array per input.

    Raises
    ------
    ValueError, TypeError
        As :func:`check_fit_arrays`.
    """
    pairs = split_features(specs, X, prefix)
    out = []
    for f, value in pairs:
        what = f"{prefix}X" if len(specs) == 1 else f"{prefix}X[{f.name!r}]"
        out.append(_check_input(f, value, what))
    rows = {f.name: a.shape[0] for f, a in zip(specs, out)}
    if len(set(rows.values())) > 1:
        raise ValueError(f"the inputs of {prefix}X have different row counts: {rows}")
    return out


def _check_input(spec: FeatureSpec, value: Any, what: str) -> np.ndarray:
    if is_padded(value):
        padded: np.ndarray = _check_padded(spec, value, what)  # made batch by batch, as sparse
        return padded
    if is_sparse(value):
        sparse: np.ndarray = _check_sparse(spec, value, what)  # a CSR matrix where arrays go
        return sparse
    arr = _as_numeric(what, value)
    dims = spec.dims
    if dims is not None and arr.ndim != len(dims):
        two_d = " (n_samples, n_features)" if len(dims) == 2 else ""
        raise ValueError(
            f"{what} must be {len(dims)}-D{two_d}: the model's input {spec.name!r} has shape "
            f"{spec.describe()}, got shape {arr.shape}"
        )
    if arr.ndim == 0:
        raise ValueError(f"{what} must have one row per sample (a first axis), got a scalar")
    if arr.shape[0] == 0:
        raise ValueError(f"{what} has no rows")
    if dims is not None:
        for axis, (want, got) in enumerate(zip(dims[1:], arr.shape[1:]), start=1):
            if want is not None and want != got:
                if len(dims) == 2:
                    raise ValueError(f"{what} has {got} features but the model expects {want}")
                raise ValueError(
                    f"{what} has {got} on axis {axis} but the model's input {spec.name!r} has shape "
                    f"{spec.describe()}; got shape {arr.shape}"
                )
    _check_finite(what, arr)
    if np.dtype(spec.dtype).kind == "f":  # np.floating's types, without np.issubdtype's 3 us
        return cast_checked(what, arr, spec.dtype)
    if spec.dtype == np.bool_:
        if arr.dtype != np.bool_ and not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{what} feeds the boolean input {spec.name!r}: give booleans (or 0/1 values)")
        return np.ascontiguousarray(arr, dtype=np.bool_)
    if np.issubdtype(spec.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.round(arr)):
            raise ValueError(
                f"{what} feeds the integer input {spec.name!r} ({spec.dtype}: ids or indices) but holds "
                f"fractions; give integers"
            )
        info = np.iinfo(spec.dtype)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise ValueError(
                f"{what} holds values beyond the range of {spec.dtype}, the type of input {spec.name!r}"
            )
        return np.ascontiguousarray(arr, dtype=spec.dtype)
    raise TypeError(f"the model's input {spec.name!r} has element type {spec.dtype}, which fit cannot feed")


def _check_padded(spec: FeatureSpec, value: PaddedRows, what: str) -> Any:
    """A padded-row array feeds a 2-D input of its own type (its values were checked when
    the CSR matrix was: the caller made it from a checked one)."""
    if (spec.dims is not None and len(spec.dims) != 2) or spec.dtype != value.dtype:
        raise ValueError(
            f"{what} is the padded-row {value.part} of a sparse matrix ({value.dtype}, 2-D) but the "
            f"model's input {spec.name!r} is {spec.dtype} of shape {spec.describe()}"
        )
    if value.shape[0] == 0:
        raise ValueError(f"{what} has no rows")
    return value


def _check_class_indices(spec: DataSpec, ya: np.ndarray, prefix: str) -> np.ndarray:
    """Class indices of the label's shape, in 0..n_classes-1 and in the label's integer type:
    one per row, or one per position for a label ``[N, d1, ...]`` (logits ``[N, C, d1, ...]``,
    or a loss that declares its ``label_shape``)."""
    if spec.label_tail:
        # a flat y is a column only for a label [N, 1]: for [N, ?] (a sequence of unknown
        # length) one label per row would broadcast against every position
        if ya.ndim == 1 and spec.label_tail == (1,):
            ya = ya.reshape(-1, 1)
        _check_label_shape(spec.label_tail, ya, prefix)
    elif ya.ndim != 1:
        ya = ya.reshape(ya.shape[0], -1)
        if ya.shape[1] != 1:
            raise ValueError(f"{prefix}y must hold one class index per row, got shape {ya.shape}")
        ya = ya[:, 0]
    if np.issubdtype(ya.dtype, np.floating) and not np.array_equal(ya, np.round(ya)):
        raise ValueError(f"{prefix}y must hold integer class indices for this loss, got fractions")
    if (ya < 0).any():
        raise ValueError(f"{prefix}y holds negative class indices; encode classes as 0..K-1")
    if spec.n_classes is not None and ya.size and ya.max() >= spec.n_classes:
        raise ValueError(
            f"{prefix}y holds class index {int(ya.max())} but the model predicts {spec.n_classes} "
            f"classes; encode classes as 0..{spec.n_classes - 1}"
        )
    # without n_classes, a huge index would wrap around (or be undefined) in the cast
    top = np.iinfo(spec.label_dtype).max
    if ya.size and ya.max() > top:
        raise ValueError(f"{prefix}y holds class index {ya.max()} beyond the label type {spec.label_dtype}")
    return np.ascontiguousarray(ya, dtype=spec.label_dtype)


def _check_label_values(spec: DataSpec, ya: np.ndarray, prefix: str) -> np.ndarray:
    """Values of the label's shape (a column or a flat vector reshaped to it)."""
    tail = spec.label_tail
    if ya.ndim == 1 and len(tail) == 1 and tail[0] in (1, None):
        ya = ya.reshape(-1, 1)
    elif ya.ndim == 2 and not tail and ya.shape[1] == 1:
        ya = ya[:, 0]
    _check_label_shape(tail, ya, prefix)
    return cast_checked(f"{prefix}y", ya, spec.label_dtype)


def _check_label_shape(tail: tuple[int | None, ...], ya: np.ndarray, prefix: str) -> None:
    """``ya`` has the label's rank and its fixed dimensions after the rows."""
    if ya.ndim != len(tail) + 1 or any(d is not None and d != k for d, k in zip(tail, ya.shape[1:])):
        want = ", ".join(["n", *(str(d) if d is not None else "?" for d in tail)])
        raise ValueError(f"{prefix}y has shape {ya.shape} but the model's label expects ({want})")


def _check_sample_weight(spec: DataSpec, sample_weight: Any, n: int, prefix: str) -> np.ndarray:
    if not spec.has_weight:
        raise ValueError(
            "sample_weight was given but the model has no sample-weight input; build it with "
            "add_loss_output(..., weight_name='weight')"
        )
    wa = _as_numeric(f"{prefix}sample_weight", sample_weight)
    if wa.ndim == 2 and wa.shape[1] == 1:  # a column, as y may be (onnxcustom took both)
        wa = wa[:, 0]
    if wa.ndim != 1 or wa.shape[0] != n:
        raise ValueError(f"{prefix}sample_weight must have shape ({n},), got {wa.shape}")
    _check_finite(f"{prefix}sample_weight", wa)
    if (wa < 0).any():
        raise ValueError(f"{prefix}sample_weight holds negative values; weights must be >= 0")
    if not wa.any():
        raise ValueError(f"{prefix}sample_weight is all zeros: there is nothing to learn from")
    return cast_checked(f"{prefix}sample_weight", wa, spec.weight_dtype)


#: device kinds whose fits keep everything on the device: the data uploaded once, shuffled
#: batches gathered there, the losses read back once per epoch. Tests add "cpu" to run that
#: path without a GPU.
DEVICE_RESIDENT_KINDS: set[str] = {"cuda"}


def device_resident(device: Device) -> bool:
    """Whether a fit on ``device`` keeps its data and losses there (DEVICE_RESIDENT_KINDS).

    Parameters
    ----------
    device : Device
        The fit's device.

    Returns
    -------
    bool
        True for a device-resident kind.
    """
    return device.kind in DEVICE_RESIDENT_KINDS


def _gather_graph(arrays: list[np.ndarray]) -> Any:
    """rows = perm[start:end]; out_k = data_k[rows]: one batch of the epoch's order, gathered
    on the device from the arrays uploaded once."""
    from onnx import TensorProto, helper

    inputs = [
        helper.make_tensor_value_info("perm", TensorProto.INT64, ["N"]),
        helper.make_tensor_value_info("start", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("end", TensorProto.INT64, [1]),
    ]
    outputs = []
    nodes = [helper.make_node("Slice", ["perm", "start", "end"], ["rows"])]
    for k, a in enumerate(arrays):
        elem = helper.np_dtype_to_tensor_dtype(a.dtype)
        tail = list(a.shape[1:])
        inputs.append(helper.make_tensor_value_info(f"data{k}", elem, ["N", *tail]))
        outputs.append(helper.make_tensor_value_info(f"batch{k}", elem, ["B", *tail]))
        nodes.append(helper.make_node("Gather", [f"data{k}", "rows"], [f"batch{k}"], axis=0))
    graph = helper.make_graph(nodes, "gather_batch", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


#: shuffled dense data on CPU up to this size (all arrays) are gathered whole at the start of
#: each epoch into one copy whose batch views stay bound (2x the data at the peak); larger or
#: sparse data are gathered batch by batch into one batch-sized buffer. A per-batch gather
#: costs a few microseconds of Python a step: a tenth of a small linear model's step
EPOCH_GATHER_MAX_BYTES = 32 << 20


def _holding_first_rows(a: np.ndarray, bounds: list[tuple[int, int]]) -> np.ndarray:
    """An epoch copy of ``a`` whose first batch holds ``a``'s first rows (load() fills the rest):
    the partial loop's sizing forward reads batch 0 before the first load(), and garbage int64
    ids failed its Gather ("out of data bounds")."""
    copy = np.empty_like(a)
    first = bounds[0][1] if bounds else 0
    copy[:first] = a[:first]
    return copy


class BatchStore:
    """The training arrays on the device once per fit, cut into fixed batch views.

    On CPU without shuffling the batch OrtValues view the caller's arrays (no copy). With
    shuffling, small dense data (EPOCH_GATHER_MAX_BYTES) are gathered whole in the epoch's order
    by :meth:`load` into one copy the batches view; otherwise every batch of a size views one
    batch-sized buffer per array, which :meth:`fill` gathers the batch's rows into just before
    its step. Either way each batch keeps its data pointer and its binding; the large data are
    never copied whole (a per-epoch gather into a full-size buffer holds 2x the data at its
    peak).

    On a device-resident kind (CUDA) without shuffling each batch is its own device tensor,
    uploaded once. With shuffling the whole arrays are uploaded once, the epoch's permutation
    once per epoch, and :meth:`fill` runs a Slice + Gather graph on the device into one
    batch-sized buffer per array and batch size (the host never touches the rows again).
    """

    def __init__(self, arrays: list[np.ndarray], batch_size: int, device: Device, shuffle: bool) -> None:
        n = arrays[0].shape[0]
        self.n = n
        #: a sparse source is densified batch by batch into the batch buffers: it goes through
        #: the gathering path, in row order when not shuffling
        self._sparse = [is_sparse(a) or is_padded(a) for a in arrays]
        sparse = any(self._sparse)
        resident = device_resident(device)
        if sparse and resident:
            raise TypeError(
                f"sparse X on {device}: the batches are gathered on the device from dense arrays; "
                "densify it (X.toarray()) or train on the CPU"
            )
        self.bounds = [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
        #: the rows of each batch (the per-step rate table reads them), and as float64 the
        #: batches' weights in an epoch's mean loss without sample weights
        self.rows_per_batch = np.array([e - s for s, e in self.bounds], dtype=np.int64)
        self._row_totals = self.rows_per_batch.astype(np.float64)
        self.sources = arrays
        self.device = device
        self.batches: list[list[Any]] = []
        self._keep: list[Any] = []
        self._order: np.ndarray | None = None
        self._gather: list[tuple[Any, Any]] = []
        #: shuffled small dense data on CPU: load() gathers the whole epoch into these copies
        self._epoch_copies: list[np.ndarray] = []
        if (
            shuffle
            and not sparse
            and not resident
            and sum(a.nbytes for a in arrays) <= EPOCH_GATHER_MAX_BYTES
        ):
            self._epoch_copies = [_holding_first_rows(a, self.bounds) for a in arrays]
        #: whether the fit loop must call fill(i) before step i
        self.gathers = (shuffle or sparse) and not self._epoch_copies
        if sparse and not shuffle:
            self._order = np.arange(n)
        if not resident:
            gathers = self.gathers
            rows = self.bounds[0][1] - self.bounds[0][0] if self.bounds and gathers else 0
            # the first rows (not empty memory): a forward may run before the first fill()
            self.buffers = (
                [np.array(dense_rows(a, slice(0, rows)), dtype=a.dtype) for a in arrays] if gathers else []
            )
            sliced = self._epoch_copies or arrays
            for s, e in self.bounds:
                views = [buf[: e - s] for buf in self.buffers] if gathers else [a[s:e] for a in sliced]
                self._keep.append(views)
                self.batches.append(
                    [ort_capi.OrtValue.ortvalue_from_numpy(v, device.ort_device) for v in views]
                )
        elif not shuffle:
            self.buffers = []
            self._keep = [[DeviceArray(a[s:e], device) for a in arrays] for s, e in self.bounds]
            self.batches = [[d.ortvalue for d in row] for row in self._keep]
        else:
            self.buffers = []
            self._init_device_gather(arrays, device)

    def _init_device_gather(self, arrays: list[np.ndarray], device: Device) -> None:
        from ._binding import make_session

        full = [DeviceArray(a, device, copy=False) for a in arrays]
        self._perm = DeviceArray(np.arange(self.n, dtype=np.int64), device)
        by_size = {
            size: [DeviceArray.zeros((size, *a.shape[1:]), a.dtype, device) for a in arrays]
            for size in sorted({e - s for s, e in self.bounds})
        }
        sess = make_session(_gather_graph(arrays), device)
        self._keep = [full, self._perm, by_size]
        host = ort_capi.OrtDevice(ort_capi.OrtDevice.cpu(), ort_capi.OrtDevice.default_memory(), 0)
        for s, e in self.bounds:
            out = by_size[e - s]
            # Slice reads its bounds on the host (CUDA kernels take them as CPU inputs): device
            # bounds would cost a device-to-host copy, and a wait, at every batch
            start, end = np.array([s], dtype=np.int64), np.array([e], dtype=np.int64)
            binding = ort_capi.SessionIOBinding(sess)
            binding.bind_ortvalue_input("perm", self._perm.ortvalue)
            binding.bind_ortvalue_input("start", ort_capi.OrtValue.ortvalue_from_numpy(start, host))
            binding.bind_ortvalue_input("end", ort_capi.OrtValue.ortvalue_from_numpy(end, host))
            for k, (src, dst) in enumerate(zip(full, out)):
                binding.bind_ortvalue_input(f"data{k}", src.ortvalue)
                binding.bind_ortvalue_output(f"batch{k}", dst.ortvalue)
            self._keep.append((start, end))
            self._gather.append((sess.run_with_iobinding, binding))
            self.batches.append([d.ortvalue for d in out])

    def load(self, order: np.ndarray | None) -> None:
        """Sets the epoch's row order (None keeps the current content)."""
        if order is None:
            return
        self._order = order
        if self._gather:
            self._perm.write(order.astype(np.int64, copy=False))
        for src, copy in zip(self.sources, self._epoch_copies):
            # mode='clip': the order is a permutation; the default 'raise' copies `out` first
            src.take(order, axis=0, out=copy, mode="clip")

    def fill(self, batch: int) -> None:
        """Gathers batch ``batch`` of the current order into the batch buffers."""
        order = self._order
        if order is None:
            raise RuntimeError("fill() needs load(order) first")
        if self._gather:
            run, binding = self._gather[batch]
            run(binding, None)
            return
        s, e = self.bounds[batch]
        for src, buf, sparse in zip(self.sources, self.buffers, self._sparse):
            if sparse:
                padded: Any = src if is_padded(src) else None
                if padded is not None:
                    padded.rows_into(order[s:e], buf[: e - s])
                else:
                    buf[: e - s] = src[order[s:e]].toarray()
                continue
            # mode='clip': the order is a permutation; the default 'raise' copies `out` first
            src.take(order[s:e], axis=0, out=buf[: e - s], mode="clip")

    def batch_totals(self, weights: np.ndarray | None, order: np.ndarray | None) -> np.ndarray:
        """Each batch's total sample weight (its weight in the epoch's mean loss)."""
        if weights is None:  # the same every epoch
            return self._row_totals
        w = weights if order is None else weights[order]
        return np.add.reduceat(w.astype(np.float64), [s for s, _ in self.bounds])

    def release_sources(self, max_bytes: int) -> bool:
        """Where the batches view the store's own host buffers (shuffled dense data: the epoch
        copies or the per-batch gather buffers) of at most ``max_bytes``, forgets the fit's
        arrays, keeping their shapes and types for :meth:`take_sources`, and returns True;
        False, unchanged, where they view the arrays themselves, live on a device or are sparse."""
        own = self._epoch_copies or self.buffers
        if self._gather or any(self._sparse) or not own or sum(a.nbytes for a in own) > max_bytes:
            return False
        self._released: list[Any] | None = [(a.shape, a.dtype) for a in self.sources]
        self.sources = []
        return True

    def take_sources(self, data: Sequence[np.ndarray | None]) -> bool:
        """Gives a released store the (dense) arrays of another fit, of the same shapes and
        types: its batch views, and the bindings made on them, then serve that fit (its
        :meth:`load` fills them). False, unchanged, for other arrays."""
        arrays = [a for a in data if a is not None]
        specs = [(a.shape, a.dtype) if isinstance(a, np.ndarray) else None for a in arrays]
        if specs != getattr(self, "_released", None):
            return False
        self.sources, self._released = arrays, None
        return True
