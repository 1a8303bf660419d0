"""Random bad input for the scikit-learn estimators: a correct result or a documented exception.

Fit and predict of OrtSGDRegressor, OrtSGDClassifier, OrtMLPRegressor and OrtMLPClassifier get
odd dtypes, memory layouts, NaN/inf, values beyond float32, huge values, empty and mis-shaped
arrays. Accepted input must give exactly what the same values give as a C-contiguous float32
array (the estimators document that they compute in float32): the same fitted weights, the same
predictions. Refused input must raise ValueError/TypeError with a message that names the
problem (scikit-learn's own validation, or ours for what it lets through); divergence must raise
ConvergenceError and leave finite weights. Outcomes are counted per kind in :data:`OUTCOMES`
(JSON in ``$ROBUSTNESS_REPORT`` when set). Deterministic: ``derandomize=True``, no database.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.exceptions import DataConversionWarning
from sklearn.utils.multiclass import type_of_target

from ort_train_core import ConvergenceError
from ort_train_sklearn import OrtMLPClassifier, OrtMLPRegressor, OrtSGDClassifier, OrtSGDRegressor
from robustness_support import new_outcomes, outcome_report, raised_as_expected, robust_settings

N_FEATURES = 3
#: examples per (estimator, kind): 4 x 13 x 8 fits (plus the reference fits) take about 15 s
EXAMPLES = 8
OUTCOMES = new_outcomes()

ROBUST = robust_settings(EXAMPLES)

ESTIMATORS: dict[str, Any] = {
    "sgd-regressor": lambda: OrtSGDRegressor(max_iter=2, tol=None, random_state=0),
    "sgd-classifier": lambda: OrtSGDClassifier(loss="log_loss", max_iter=2, tol=None, random_state=0),
    "mlp-regressor": lambda: OrtMLPRegressor(hidden_layer_sizes=(4,), max_iter=2, tol=None, random_state=0),
    "mlp-classifier": lambda: OrtMLPClassifier(hidden_layer_sizes=(4,), max_iter=2, tol=None, random_state=0),
}


_report_outcomes = outcome_report("sklearn", OUTCOMES)


@dataclass
class Case:
    """``error`` None: accepted, with the result of ``X_ref``/``y_ref``; else the exception
    type(s) and a regex of the message. ``warns``: a warning the call must emit."""

    kind: str
    X: Any
    y: Any
    w: Any = None
    X_ref: Any = None
    y_ref: Any = None
    error: tuple[type[BaseException], ...] | None = None
    match: str = ""
    warns: type[Warning] | None = None


def _floats(shape: Any) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float64, shape, elements=st.floats(-4, 4, width=16))


def _f32(X: Any) -> np.ndarray:
    return np.ascontiguousarray(X, dtype=np.float32)


@st.composite
def targets(draw: st.DrawFn, n: int, classifier: bool) -> np.ndarray:
    """Regression targets, or class labels 0..k-1 with every class present (k <= n)."""
    if not classifier:
        return draw(_floats((n,)))
    k = draw(st.integers(2, min(3, n)))
    order = draw(st.permutations(range(n)))
    return np.asarray(order) % k


@st.composite
def fit_cases(
    draw: st.DrawFn, kind: str, classifier: bool, multi_output: bool, multilabel: bool = False
) -> Case:
    n = draw(st.integers(3, 9))
    X = draw(_floats((n, N_FEATURES)))
    y = draw(targets(n, classifier))

    if kind == "dtype":
        how = draw(
            st.sampled_from(["float16", "float32", "int8", "int64", "uint8", "bool", "list", "numeric-str"])
        )
        Xd: Any
        if how in ("float16", "float32"):
            Xd = X.astype(how)
        elif how in ("int8", "int64"):
            Xd = np.round(X).astype(how)
        elif how == "uint8":
            Xd = np.abs(np.round(X)).astype(np.uint8)
        elif how == "bool":
            Xd = X > 0
        elif how == "list":
            Xd = X.tolist()
        else:  # scikit-learn converts numeric strings
            Xd = X.astype(str)
        ref = _f32(np.asarray(Xd, dtype=np.float64))
        return Case(kind, Xd, y, X_ref=ref, y_ref=y)

    if kind == "layout":
        how = draw(st.sampled_from(["fortran", "strided", "transposed", "reversed"]))
        if how == "fortran":
            Xl = np.asfortranarray(X)
        elif how == "strided":
            big = np.zeros((2 * n, 2 * N_FEATURES))
            big[1::2, ::2] = X
            Xl = big[1::2, ::2]
        elif how == "transposed":
            Xl = np.ascontiguousarray(X.T).T
        else:
            Xl = X[::-1]
        return Case(kind, Xl, y, X_ref=_f32(Xl), y_ref=y)

    if kind == "labels":  # the same targets under other types
        if classifier:
            how = draw(st.sampled_from(["str", "float", "int8", "list"]))
            yl: Any = {
                "str": y.astype(str),
                "float": y.astype(np.float64),
                "int8": y.astype(np.int8),
                "list": y.tolist(),
            }[how]
        else:
            how = draw(st.sampled_from(["float16", "int", "list", "strided"]))
            if how == "float16":
                yl = y.astype(np.float16)
            elif how == "int":
                yl = np.round(y).astype(np.int64)
            elif how == "list":
                yl = y.tolist()
            else:
                yl = np.repeat(y, 3)[::3]
        y_ref = np.asarray(yl) if classifier else np.asarray(yl, dtype=np.float32)
        return Case(kind, X, yl, X_ref=_f32(X), y_ref=y_ref)

    if kind == "bad-dtype":
        how = draw(st.sampled_from(["complex", "words", "none"]))
        if how == "complex":
            return Case(kind, X.astype(complex), y, error=(ValueError,), match=r"Complex data not supported")
        if how == "words":
            words = np.array([["a", "b", "c"][i % 3] for i in range(X.size)]).reshape(X.shape)
            return Case(kind, words, y, error=(ValueError,), match=r"could not convert string to float")
        Xo = X.astype(object)
        Xo[0, 0] = None
        return Case(kind, Xo, y, error=(ValueError,), match=r"Input X contains NaN")

    if kind == "nonfinite":
        value = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        which = draw(st.sampled_from(["X", "y"] if not classifier else ["X"]))
        arr = (X if which == "X" else y.astype(np.float64)).copy()
        arr.reshape(-1)[draw(st.integers(0, arr.size - 1))] = value
        word = "NaN" if np.isnan(value) else "infinity"
        Xb, yb = (arr, y) if which == "X" else (X, arr)
        return Case(kind, Xb, yb, error=(ValueError,), match=rf"Input {which} contains {word}")

    if kind == "beyond-float32":
        which = draw(st.sampled_from(["X", "y"] if not classifier else ["X"]))
        arr = (X if which == "X" else y.astype(np.float64)).copy()
        arr.reshape(-1)[draw(st.integers(0, arr.size - 1))] = draw(st.sampled_from([1e39, -1e300]))
        Xb, yb = (arr, y) if which == "X" else (X, arr)
        return Case(kind, Xb, yb, error=(ValueError,), match=rf"^{which} holds 1 value\(s\) beyond the range")

    if kind == "huge":
        scale = draw(st.sampled_from([1e20, 1e30, 3e38]))
        Xh = (np.where(X == 0, 1.0, X) * scale / 4).astype(np.float32)
        return Case(kind, Xh, y, X_ref=Xh, y_ref=y)  # ok (finite) or ConvergenceError

    if kind == "empty":
        return Case(
            kind, np.empty((0, N_FEATURES)), y[:0], error=(ValueError,), match=r"Found array with 0 sample"
        )

    if kind == "rank":
        shape = draw(st.sampled_from([(n,), (n, N_FEATURES, 1)]))
        return Case(kind, np.zeros(shape), y, error=(ValueError,), match=r"(Expected 2D array|dim 3)")

    if kind == "y-length":
        m = draw(st.integers(1, 12).filter(lambda m: m != n))
        yb = np.resize(y, m)
        return Case(kind, X, yb, error=(ValueError,), match=r"inconsistent numbers of samples")

    if kind == "y-shape":
        how = draw(st.sampled_from(["column", "two-columns", "3-d"]))
        if how == "column":
            return Case(kind, X, y.reshape(n, 1), X_ref=_f32(X), y_ref=y, warns=DataConversionWarning)
        if how == "two-columns":
            y2 = np.stack([y, y[::-1]], axis=1)
            if multi_output:
                return Case(kind, X, y2, X_ref=_f32(X), y_ref=y2)
            if multilabel and type_of_target(y2) == "multilabel-indicator":
                # MLPClassifier: two 0/1 columns are multilabel indicators, as scikit-learn's
                return Case(kind, X, y2, X_ref=_f32(X), y_ref=y2)
            return Case(
                kind, X, y2, error=(ValueError,), match=r"y should be a 1d array|one class index per row"
            )
        return Case(kind, X, y.reshape(n, 1, 1), error=(ValueError,), match=r"dim 3")

    # sample weights
    how = draw(st.sampled_from(["ok", "negative", "nan", "zeros", "length", "beyond-float32"]))
    w = draw(hnp.arrays(np.float64, (n,), elements=st.floats(0.25, 4, width=16)))
    if how == "ok":
        return Case(kind, X, y, w=w, X_ref=_f32(X), y_ref=y)
    match = {
        "negative": r"Negative values in data passed to `?sample_weight",
        "nan": r"Input sample_weight contains NaN",
        "zeros": r"(sample_weight is all zeros|Sample weights must contain at least one non-zero)",
        "length": r"sample_weight.shape == \(\d+,\), expected \(\d+,\)",
        "beyond-float32": r"^sample_weight holds 1 value\(s\) beyond the range of float32",
    }[how]
    if how == "negative":
        w[0] = -1.0
    elif how == "nan":
        w[0] = np.nan
    elif how == "zeros":
        w[:] = 0.0
    elif how == "length":
        w = np.ones(n + 1)
    else:
        w[0] = 1e39
    return Case(kind, X, y, w=w, error=(ValueError,), match=match)


FIT_KINDS = [
    "dtype",
    "layout",
    "labels",
    "bad-dtype",
    "nonfinite",
    "beyond-float32",
    "huge",
    "empty",
    "rank",
    "y-length",
    "y-shape",
    "sample-weight",
]


def _weights(est: Any) -> list[np.ndarray]:
    if hasattr(est, "coefs_"):
        return [*est.coefs_, *est.intercepts_]
    return [np.asarray(est.coef_), np.asarray(est.intercept_)]


def _fit(est: Any, case: Case, X: Any, y: Any) -> None:
    if case.w is None:
        est.fit(X, y)
    else:
        est.fit(X, y, sample_weight=case.w)


def check_fit(name: str, case: Case) -> None:
    est = ESTIMATORS[name]()
    error: BaseException | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _fit(est, case, case.X, case.y)
        except (ValueError, TypeError, ConvergenceError) as exc:
            error = exc
    OUTCOMES[f"fit {case.kind}"].update(["ok" if error is None else type(error).__name__])
    categories = {w.category for w in caught}
    if case.kind == "huge":
        # scikit-learn's own finiteness check sums X, which overflows: not ours to silence
        sums = [w for w in caught if re.search(r"encountered in (reduce|add)", str(w.message))]
        if sums and all(w.category is RuntimeWarning for w in sums):
            categories.discard(RuntimeWarning)
    if case.warns is not None:
        assert case.warns in categories, f"{case.kind}: expected {case.warns.__name__}, got {caught}"
        categories.discard(case.warns)
    assert not categories, f"{case.kind}: unexpected warnings {[str(w.message) for w in caught]}"
    if isinstance(error, ConvergenceError):
        assert case.kind == "huge", f"{case.kind}: unexpected divergence {error}"
        trainer = est._trainer
        assert all(np.isfinite(v).all() for v in trainer.get_state().values()), "weights left non-finite"
        return
    if raised_as_expected(case, error):
        return
    got = _weights(est)
    assert all(np.isfinite(v).all() for v in got), f"{case.kind}: non-finite weights {got}"
    ref = ESTIMATORS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataConversionWarning)
        _fit(ref, case, case.X_ref, case.y_ref)
    for a, b in zip(got, _weights(ref)):
        np.testing.assert_array_equal(a, b, err_msg=case.kind)
    if case.kind != "huge":
        pred, expected = est.predict(case.X), ref.predict(case.X_ref)
        np.testing.assert_array_equal(np.asarray(pred), np.asarray(expected).astype(np.asarray(pred).dtype))


def _fit_params() -> list[Any]:
    out = []
    for name in ESTIMATORS:
        for kind in FIT_KINDS:
            out.append(pytest.param(name, kind, id=f"{name}-{kind}"))
    return out


@pytest.mark.parametrize(("name", "kind"), _fit_params())
def test_fit_on_random_input(name: str, kind: str) -> None:
    classifier = "classifier" in name
    multi_output = name == "mlp-regressor"

    @ROBUST
    @given(case=fit_cases(kind, classifier, multi_output, multilabel=name == "mlp-classifier"))
    def run(case: Case) -> None:
        check_fit(name, case)

    run()


# ---- predict --------------------------------------------------------------------------------------

_FITTED: dict[str, Any] = {}


def _fitted(name: str) -> Any:
    if name not in _FITTED:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((30, N_FEATURES))
        y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 1) if "classifier" in name else X @ [1.0, -2.0, 0.5]
        _FITTED[name] = ESTIMATORS[name]().fit(X, y)
    return _FITTED[name]


PREDICT_KINDS = ["dtype", "layout", "nonfinite", "beyond-float32", "huge", "empty", "n-features", "rank"]
PREDICT_KINDS += ["complex"]


@st.composite
def predict_cases(draw: st.DrawFn, kind: str) -> Case:
    n = draw(st.integers(1, 7))
    X = draw(_floats((n, N_FEATURES)))
    if kind == "dtype":
        dtype = draw(st.sampled_from([np.float16, np.float32, np.int32, np.bool_]))
        Xd = (X > 0) if dtype == np.bool_ else (np.round(X) if dtype == np.int32 else X).astype(dtype)
        return Case(kind, Xd, None, X_ref=_f32(Xd))
    if kind == "layout":
        Xl = draw(st.sampled_from([np.asfortranarray(X), X[::-1], np.ascontiguousarray(X.T).T]))
        return Case(kind, Xl, None, X_ref=_f32(Xl))
    if kind == "nonfinite":
        Xb = X.copy()
        Xb.reshape(-1)[draw(st.integers(0, X.size - 1))] = draw(st.sampled_from([np.nan, np.inf]))
        return Case(kind, Xb, None, error=(ValueError,), match=r"Input X contains (NaN|infinity)")
    if kind == "beyond-float32":
        Xb = X.copy()
        Xb[0, 0] = 1e39
        return Case(kind, Xb, None, error=(ValueError,), match=r"^X holds 1 value\(s\) beyond the range")
    if kind == "huge":  # finite float32 input: the outputs may overflow but never turn NaN silently
        return Case(kind, (X * 1e30).astype(np.float32), None, X_ref=(X * 1e30).astype(np.float32))
    if kind == "empty":
        return Case(kind, X[:0], None, error=(ValueError,), match=r"Found array with 0 sample")
    if kind == "n-features":
        k = draw(st.sampled_from([1, 2, 4, 7]))
        return Case(kind, np.zeros((n, k)), None, error=(ValueError,), match=rf"X has {k} features")
    if kind == "rank":
        return Case(kind, X[0], None, error=(ValueError,), match=r"Expected 2D array")
    return Case(kind, X.astype(complex), None, error=(ValueError,), match=r"Complex data not supported")


@pytest.mark.parametrize("kind", PREDICT_KINDS)
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_predict_on_random_input(name: str, kind: str) -> None:
    est = _fitted(name)
    methods = ["predict"] + (["predict_proba", "decision_function"] if "classifier" in name else [])

    @ROBUST
    @given(case=predict_cases(kind))
    def run(case: Case) -> None:
        for method in methods:
            error: BaseException | None = None
            try:
                got = getattr(est, method)(case.X)
            except (ValueError, TypeError) as exc:
                error = exc
            OUTCOMES[f"predict {case.kind}"].update(["ok" if error is None else type(error).__name__])
            if raised_as_expected(case, error):
                continue
            expected = getattr(est, method)(case.X_ref)
            assert len(got) == len(case.X)
            # in the narrower of the two types: float64 probabilities are normalised in float64,
            # the float32 ones are those rounded
            got, expected = np.asarray(got), np.asarray(expected)
            narrow = got.dtype if got.dtype.itemsize <= expected.dtype.itemsize else expected.dtype
            np.testing.assert_array_equal(got.astype(narrow), expected.astype(narrow))
            if method != "predict" or "regressor" in name:
                assert not np.isnan(np.asarray(got, dtype=np.float64)).any(), f"{case.kind}: NaN {method}"

    run()
