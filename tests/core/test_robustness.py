"""Random bad input for the core trainers: a correct result or a documented exception, never a
crash or silent garbage.

Each example draws one *kind* of input (odd dtypes, memory layouts, NaN/inf, values beyond
float32, huge values, empty or mis-shaped arrays, bad sample weights) and fits
``OrtGradientOptimizer`` / ``OrtGradientForwardBackwardOptimizer`` on a small linear model and an
MLP. Accepted input must give exactly the weights the same values give as a C-contiguous float32
array (the independent reference: what the trainer documents it converts to); refused input must
raise ValueError/TypeError whose message names the array at fault; divergence must raise
ConvergenceError with finite weights. The outcomes are counted per kind in :data:`OUTCOMES`
(written as JSON to the folder named by ``$ROBUSTNESS_REPORT`` when set).

Deterministic (``derandomize=True``, no example database) and bounded for CI.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from core_models import build_linear, build_mlp
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ort_train_core import (
    ConvergenceError,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from robustness_support import new_outcomes, outcome_report, raised_as_expected, robust_settings

N_FEATURES = {"linear": 3, "mlp": 4}
#: examples per (loop, architecture, kind); 4 x 14 x 15 fits take about 10 s
EXAMPLES = 15

#: kind -> outcome (class name or "ok") -> count, over every example of this module
OUTCOMES = new_outcomes()

ROBUST = robust_settings(EXAMPLES)


_report_outcomes = outcome_report("core", OUTCOMES)


# ---- the inputs ---------------------------------------------------------------------------------


@dataclass
class Case:
    """One drawn input and what it must lead to.

    ``error`` None: the fit must succeed with the weights of the reference arrays ``X_ref``,
    ``y_ref``, ``w_ref``. Otherwise the exception type(s) and a regex its message must match.
    """

    kind: str
    X: Any
    y: Any
    w: Any = None
    X_ref: np.ndarray | None = None
    y_ref: np.ndarray | None = None
    w_ref: np.ndarray | None = None
    error: tuple[type[BaseException], ...] | None = None
    match: str = ""


def _small_floats(dtype: Any, shape: Any) -> st.SearchStrategy[np.ndarray]:
    """Values any dtype holds exactly enough (float16 included) and that train without overflow."""
    return hnp.arrays(dtype, shape, elements=st.floats(-4, 4, width=16))


def _ref(X: Any) -> np.ndarray:
    return np.ascontiguousarray(X, dtype=np.float32)


KINDS = [
    "dtype",
    "layout",
    "y-dtype-shape",
    "bad-dtype",
    "nonfinite",
    "beyond-float32",
    "huge",
    "empty",
    "n-features",
    "rank",
    "y-length",
    "y-shape",
    "sample-weight-ok",
    "sample-weight-bad",
]
#: the kinds that must be refused whatever is drawn (no sample weight: validation data has none)
REFUSED = ["bad-dtype", "nonfinite", "beyond-float32", "empty", "n-features", "rank", "y-length", "y-shape"]


@st.composite
def cases(draw: st.DrawFn, n_features: int, kind: str) -> Case:
    n = draw(st.integers(1, 9))
    X = draw(_small_floats(np.float64, (n, n_features)))
    y = draw(_small_floats(np.float64, (n,)))
    ok = Case(kind, X, y, X_ref=_ref(X), y_ref=_ref(y))

    if kind == "dtype":
        dtype = draw(
            st.sampled_from(
                [
                    np.float16,
                    np.float32,
                    np.float64,
                    np.int8,
                    np.int16,
                    np.int32,
                    np.int64,
                    np.uint8,
                    np.bool_,
                ]
            )
        )
        if dtype == np.bool_:
            Xd = X > 0
        elif np.issubdtype(dtype, np.integer):
            Xd = np.abs(np.round(X)).astype(dtype) if dtype == np.uint8 else np.round(X).astype(dtype)
        else:
            Xd = X.astype(dtype)
        as_list = draw(st.booleans())
        return Case(kind, Xd.tolist() if as_list else Xd, y, X_ref=_ref(Xd), y_ref=ok.y_ref)

    if kind == "layout":
        how = draw(st.sampled_from(["fortran", "strided", "transposed", "reversed", "broadcast"]))
        if how == "fortran":
            Xl = np.asfortranarray(X)
        elif how == "strided":
            big = np.zeros((2 * n, 3 * n_features), dtype=X.dtype)
            big[::2, 1::3] = X
            Xl = big[::2, 1::3]
        elif how == "transposed":
            Xl = np.ascontiguousarray(X.T).T
        elif how == "reversed":
            Xl = X[::-1, ::-1]
        else:  # a zero-stride view: every row the same
            Xl = np.broadcast_to(X[:1], X.shape)
        assert how == "fortran" or not Xl.flags.c_contiguous or n == 1
        yl = y[::-1] if how == "reversed" else y
        return Case(kind, Xl, yl, X_ref=_ref(Xl), y_ref=_ref(yl))

    if kind == "y-dtype-shape":
        how = draw(st.sampled_from(["int", "bool", "float16", "column", "list", "strided"]))
        yv: Any
        if how == "int":
            yv = np.round(y).astype(np.int64)
        elif how == "bool":
            yv = y > 0
        elif how == "float16":
            yv = y.astype(np.float16)
        elif how == "column":
            yv = y.reshape(n, 1)
        elif how == "list":
            yv = y.tolist()
        else:
            yv = np.repeat(y, 2)[::2]
        return Case(kind, X, yv, X_ref=ok.X_ref, y_ref=_ref(np.asarray(yv).reshape(n)))

    if kind == "bad-dtype":
        which = draw(st.sampled_from(["X", "y"]))
        dtype = draw(st.sampled_from(["complex", "object-str", "str", "bytes", "object-num", "datetime"]))
        arr = X if which == "X" else y
        bad: Any
        if dtype == "complex":
            bad = arr.astype(np.complex128)
        elif dtype == "object-str":
            bad = np.array([str(v) for v in arr.ravel()], dtype=object).reshape(arr.shape)
        elif dtype == "str":
            bad = arr.astype(str)
        elif dtype == "bytes":
            bad = arr.astype(bytes)
        elif dtype == "object-num":
            bad = arr.astype(object)
        else:
            bad = np.round(arr).astype("datetime64[s]")
        Xb, yb = (bad, y) if which == "X" else (X, bad)
        return Case(kind, Xb, yb, error=(TypeError,), match=rf"^{which} (must hold numbers|is complex)")

    if kind == "nonfinite":
        which = draw(st.sampled_from(["X", "y"]))
        value = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
        arr = (X if which == "X" else y).astype(dtype)
        flat = arr.reshape(-1)
        count = draw(st.integers(1, flat.size))
        flat[draw(st.permutations(range(flat.size)))[:count]] = value
        Xb, yb = (arr, y) if which == "X" else (X, arr)
        return Case(
            kind, Xb, yb, error=(ValueError,), match=rf"^{which} contains {count} NaN or infinite value"
        )

    if kind == "beyond-float32":
        which = draw(st.sampled_from(["X", "y"]))
        arr = (X if which == "X" else y).copy()
        flat = arr.reshape(-1)
        flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from([1e39, -1e39, 1e300, -3.5e38]))
        Xb, yb = (arr, y) if which == "X" else (X, arr)
        return Case(kind, Xb, yb, error=(ValueError,), match=rf"^{which} holds 1 value\(s\) beyond the range")

    if kind == "huge":
        scale = draw(st.sampled_from([1e20, 1e30, 3e38]))
        Xh = (np.where(X == 0, 1.0, X) * scale / 4).astype(np.float32)
        return Case(kind, Xh, y, X_ref=Xh, y_ref=ok.y_ref)  # error decided by the fit, see below

    if kind == "empty":
        return Case(
            kind, np.empty((0, n_features)), np.empty(0), error=(ValueError,), match=r"^X has no rows"
        )

    if kind == "n-features":
        k = draw(st.integers(0, 2 * n_features).filter(lambda k: k != n_features))
        return Case(
            kind,
            np.zeros((n, k)),
            y,
            error=(ValueError,),
            match=rf"^X has {k} features but the model expects {n_features}",
        )

    if kind == "rank":
        shape = draw(st.sampled_from([(), (n,), (n, n_features, 1), (1, n, n_features)]))
        return Case(kind, np.zeros(shape), y, error=(ValueError,), match=r"^X must be 2-D")

    if kind == "y-length":
        m = draw(st.integers(0, 12).filter(lambda m: m != n))
        return Case(kind, X, np.zeros(m), error=(ValueError,), match=rf"^y has {m} rows but X has {n}")

    if kind == "y-shape":
        tail = draw(st.sampled_from([(2,), (3,), (1, 1), (2, 1)]))
        return Case(kind, X, np.zeros((n, *tail)), error=(ValueError,), match=r"^y has shape")

    if kind == "sample-weight-ok":
        w = draw(hnp.arrays(np.float64, (n,), elements=st.floats(0.25, 4, width=16)))
        wv = draw(st.sampled_from([w, w.astype(np.float32), w.tolist(), np.repeat(w, 2)[::2]]))
        return Case(kind, X, y, w=wv, X_ref=ok.X_ref, y_ref=ok.y_ref, w_ref=_ref(w))

    # sample-weight-bad
    how = draw(st.sampled_from(["negative", "nan", "zeros", "length", "2-d", "complex", "huge"]))
    w = np.ones(n)
    match = r"^sample_weight "
    if how == "negative":
        w[draw(st.integers(0, n - 1))] = -1.0
        match += "holds negative"
    elif how == "nan":
        w[draw(st.integers(0, n - 1))] = np.nan
        match += "contains 1 NaN"
    elif how == "zeros":
        w = np.zeros(n)
        match += "is all zeros"
    elif how == "length":
        w = np.ones(n + draw(st.sampled_from([-1, 1, 5])))
        match += "must have shape"
    elif how == "2-d":
        w = np.ones((n, 2))
        match += "must have shape"
    elif how == "complex":
        return Case(kind, X, y, w=w.astype(complex), error=(TypeError,), match=match + "is complex")
    else:
        w[0] = 1e39
        match += r"holds 1 value\(s\) beyond the range"
    return Case(kind, X, y, w=w, error=(ValueError,), match=match)


# ---- the trainers -------------------------------------------------------------------------------

_TRAINERS: dict[tuple[str, str], Any] = {}


def _trainer(loop: str, arch: str) -> Any:
    """One trainer per (loop, architecture) for the whole module: its sessions are built once.
    ``warm_start=False`` and a fixed ``random_state`` make every fit start from the same state."""
    key = (loop, arch)
    if key not in _TRAINERS:
        model = build_linear(N_FEATURES[arch]) if arch == "linear" else build_mlp(N_FEATURES[arch])
        common: dict[str, Any] = dict(max_iter=2, batch_size=4, learning_rate=0.01, random_state=0)
        if loop == "full":
            _TRAINERS[key] = OrtGradientOptimizer(add_loss_output(model, weight_name="weight"), **common)
        else:
            _TRAINERS[key] = OrtGradientForwardBackwardOptimizer(model, weight_name="weight", **common)
    return _TRAINERS[key]


def _initial(trainer: Any) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in trainer._initial_state().weights.items()}


def _all_finite(state: dict[str, np.ndarray]) -> bool:
    return all(np.isfinite(v).all() for v in state.values())


def check_case(trainer: Any, case: Case, record: Callable[[str], None]) -> None:
    """Fits ``case`` and checks the outcome against the case's promise."""
    error: BaseException | None = None
    try:
        trainer.fit(case.X, case.y, sample_weight=case.w)
    except (ValueError, TypeError, ConvergenceError) as exc:
        error = exc
    record("ok" if error is None else type(error).__name__)
    if isinstance(error, ConvergenceError):
        assert case.kind == "huge", f"{case.kind}: unexpected divergence {error}"
        state = trainer.get_state()
        assert _all_finite(state), f"weights not rolled back to finite values: {state}"
        # an inf first loss of an epoch condemns the previous epoch's end weights: one more back
        kept = error.epoch - 1 if error.batch == 0 and error.epoch > 0 else error.epoch
        assert trainer.n_iter_ == kept
        if kept == 0:  # nothing kept: back to the initial weights
            for name, value in _initial(trainer).items():
                np.testing.assert_array_equal(state[name], value)
        return
    if raised_as_expected(case, error):
        return
    got = trainer.get_state()
    assert _all_finite(got), f"{case.kind}: the fit returned non-finite weights silently: {got}"
    assert np.isfinite(trainer.train_losses_).all()
    trainer.fit(case.X_ref, case.y_ref, sample_weight=case.w_ref)
    expected = trainer.get_state()
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=f"{case.kind}: weight {name}")


def _params() -> list[Any]:
    out = []
    for loop in ("full", "partial"):
        for arch in ("linear", "mlp"):
            for kind in KINDS:
                out.append(pytest.param(loop, arch, kind, id=f"{loop}-{arch}-{kind}"))
    return out


@pytest.mark.parametrize(("loop", "arch", "kind"), _params())
def test_fit_on_random_input(loop: str, arch: str, kind: str) -> None:
    trainer = _trainer(loop, arch)

    @ROBUST
    @given(case=cases(N_FEATURES[arch], kind))
    def run(case: Case) -> None:
        check_case(trainer, case, lambda outcome: OUTCOMES[case.kind].update([outcome]))

    run()


@pytest.mark.parametrize("kind", REFUSED)
def test_validation_data_gets_the_same_checks(kind: str) -> None:
    """X_val/y_val go through the same validation, with 'validation' in the message."""
    trainer = _trainer("full", "linear")

    @ROBUST
    @given(case=cases(N_FEATURES["linear"], kind))
    def run(case: Case) -> None:
        X = np.zeros((4, N_FEATURES["linear"]), dtype=np.float32)
        y = np.zeros(4, dtype=np.float32)
        with pytest.raises(case.error or ()) as info:
            trainer.fit(X, y, X_val=case.X, y_val=case.y)
        OUTCOMES[f"validation {case.kind}"].update([info.type.__name__])
        assert re.search(case.match.replace("^", "^validation "), str(info.value)), str(info.value)

    run()


@pytest.mark.parametrize("loop", ["full", "partial"])
@pytest.mark.parametrize("max_iter", [1, 3])
def test_overflowing_gradient_with_a_finite_loss(loop: str, max_iter: int) -> None:
    """Zero initial weights (as scikit-learn's SGD starts), X = 1e37, y = 100: the first loss is
    100**2 = 1e4, finite, but the gradient 2 * 1e37 * 100 overflows float32, so the step writes
    inf into the weights. With max_iter=1 the fit returns them; with more epochs the next loss is
    inf and the ConvergenceError "restored" the end of epoch 1, the same inf weights (a fixed
    bug). The fit must raise ConvergenceError and keep finite weights (the initial ones)."""
    zeros = build_linear(coef=np.zeros((3, 1), np.float32), intercept=np.zeros(1, np.float32))
    common: dict[str, Any] = dict(max_iter=max_iter, batch_size=4, learning_rate=0.01, random_state=0)
    if loop == "full":
        trainer: Any = OrtGradientOptimizer(add_loss_output(zeros), **common)
    else:
        trainer = OrtGradientForwardBackwardOptimizer(zeros, **common)
    X = np.full((4, 3), 1e37, dtype=np.float32)
    y = np.full(4, 100.0, dtype=np.float32)
    assert np.isfinite(((X @ np.zeros(3) - y) ** 2).mean())  # the loss the first step reports
    with pytest.raises(ConvergenceError, match="gradient"):
        trainer.fit(X, y)
    state = trainer.get_state()
    assert _all_finite(state), f"non-finite weights kept: {state}"
    for value in state.values():
        np.testing.assert_array_equal(value, 0.0)
