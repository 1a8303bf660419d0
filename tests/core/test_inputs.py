"""Bad input is refused with a ValueError/TypeError that names the problem, and a refused fit
trains nothing; a diverging fit raises ConvergenceError and rolls back to the last finite epoch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from backend_support import TRAINING_BUILD
from ort_train_core import (
    ConvergenceError,
    LearningRateSGD,
    OrtGradientOptimizer,
    add_loss_output,
)


def _snapshot(trainer: OrtGradientOptimizer) -> tuple[dict[str, np.ndarray], int, list[float]]:
    return trainer.get_state(), trainer.n_iter_, list(trainer.train_losses_)


def _assert_unchanged(trainer: OrtGradientOptimizer, before: tuple) -> None:
    state, n_iter, losses = before
    after = trainer.get_state()
    assert sorted(after) == sorted(state)
    for name, value in state.items():
        np.testing.assert_array_equal(after[name], value)
    assert trainer.n_iter_ == n_iter
    assert trainer.train_losses_ == losses


@pytest.fixture
def fitted(linear_loss_model, linear_data, ref):
    """A trainer fitted for one epoch whose next fit would continue (warm_start=True), so that
    a fit that trained anything would show in the state."""
    X, y = linear_data
    t = OrtGradientOptimizer(linear_loss_model, max_iter=1, learning_rate=0.05, random_state=0)
    t.fit(X, y)
    initial = ref.initializers(linear_loss_model)
    assert not np.array_equal(t.get_state()["coef"], initial["coef"])  # it did train
    t.set_params(warm_start=True)
    return t


@pytest.fixture
def fitted_weighted(weighted_linear_loss_model, linear_data):
    X, y = linear_data
    t = OrtGradientOptimizer(weighted_linear_loss_model, max_iter=1, learning_rate=0.05)
    t.fit(X, y, sample_weight=np.ones(len(X)))
    t.set_params(warm_start=True)
    return t


def _with(arr: np.ndarray, index: tuple, value: float) -> np.ndarray:
    out = np.array(arr, dtype=np.float64)
    out[index] = value
    return out


@pytest.mark.parametrize(
    ("make_bad", "error", "match"),
    [
        pytest.param(
            lambda X, y: (np.hstack([X, X[:, :1]]), y),
            ValueError,
            r"X has 4 features but the model expects 3",
            id="too-many-features",
        ),
        pytest.param(
            lambda X, y: (X[:, :2], y),
            ValueError,
            r"X has 2 features but the model expects 3",
            id="too-few-features",
        ),
        pytest.param(lambda X, y: (X, y[:-1]), ValueError, r"y has 22 rows but X has 23", id="y-short"),
        pytest.param(
            lambda X, y: (X, np.concatenate([y, y[:1]])),
            ValueError,
            r"y has 24 rows but X has 23",
            id="y-long",
        ),
        pytest.param(
            lambda X, y: (_with(X, (3, 1), np.nan), y),
            ValueError,
            r"X contains 1 NaN or infinite",
            id="nan-X",
        ),
        pytest.param(
            lambda X, y: (_with(X, (0, 0), np.inf), y),
            ValueError,
            r"X contains 1 NaN or infinite",
            id="inf-X",
        ),
        pytest.param(
            lambda X, y: (X, _with(y, (5,), np.nan)),
            ValueError,
            r"y contains 1 NaN or infinite",
            id="nan-y",
        ),
        pytest.param(
            lambda X, y: (X, _with(y, (5,), -np.inf)),
            ValueError,
            r"y contains 1 NaN or infinite",
            id="inf-y",
        ),
        pytest.param(
            lambda X, y: (X.astype(str), y),
            TypeError,
            r"X must hold numbers, got dtype <U",
            id="string-X",
        ),
        pytest.param(
            lambda X, y: (X.astype(object), y),
            TypeError,
            r"X must hold numbers, got dtype object",
            id="object-X",
        ),
        pytest.param(
            lambda X, y: (X, np.array(["a"] * len(y), dtype=object)),
            TypeError,
            r"y must hold numbers, got dtype object",
            id="object-y",
        ),
    ],
)
def test_bad_arrays_are_refused_and_train_nothing(fitted, linear_data, make_bad, error, match):
    X, y = make_bad(*linear_data)
    before = _snapshot(fitted)
    with pytest.raises(error, match=match):
        fitted.fit(X, y)
    _assert_unchanged(fitted, before)


def test_nan_in_validation_data_is_refused(fitted, linear_data):
    X, y = linear_data
    before = _snapshot(fitted)
    with pytest.raises(ValueError, match=r"validation X contains 1 NaN"):
        fitted.fit(X, y, X_val=_with(X, (0, 2), np.nan), y_val=y)
    with pytest.raises(ValueError, match=r"X_val and y_val"):
        fitted.fit(X, y, X_val=X)
    _assert_unchanged(fitted, before)


@pytest.mark.parametrize(
    ("make_weight", "match"),
    [
        pytest.param(lambda n: _with(np.ones(n), (4,), -0.5), r"sample_weight holds negative", id="negative"),
        pytest.param(
            lambda n: np.ones(n - 1), r"sample_weight must have shape \(23,\), got \(22,\)", id="short"
        ),
        pytest.param(
            lambda n: np.ones((n, 2)), r"sample_weight must have shape \(23,\), got \(23, 2\)", id="2d"
        ),
        pytest.param(lambda n: _with(np.ones(n), (0,), np.nan), r"sample_weight contains 1 NaN", id="nan"),
        pytest.param(lambda n: np.zeros(n), r"sample_weight is all zeros", id="all-zero"),
    ],
)
def test_bad_sample_weight_is_refused(fitted_weighted, linear_data, make_weight, match):
    X, y = linear_data
    before = _snapshot(fitted_weighted)
    with pytest.raises(ValueError, match=match):
        fitted_weighted.fit(X, y, sample_weight=make_weight(len(X)))
    _assert_unchanged(fitted_weighted, before)


def test_sample_weight_without_weight_input(fitted, linear_data):
    X, y = linear_data
    before = _snapshot(fitted)
    with pytest.raises(ValueError, match=r"sample_weight was given but the model has no sample-weight input"):
        fitted.fit(X, y, sample_weight=np.ones(len(X)))
    _assert_unchanged(fitted, before)


@pytest.mark.parametrize(
    ("params", "error", "match"),
    [
        pytest.param(
            {"batch_size": 0}, ValueError, r"batch_size must be an integer > 0, got 0", id="batch-0"
        ),
        pytest.param(
            {"batch_size": -4}, ValueError, r"batch_size must be an integer > 0, got -4", id="batch-neg"
        ),
        pytest.param({"batch_size": 2.5}, ValueError, r"batch_size must be an integer > 0", id="batch-float"),
        pytest.param({"max_iter": 0}, ValueError, r"max_iter must be an integer > 0, got 0", id="iter-0"),
        pytest.param({"max_iter": -1}, ValueError, r"max_iter must be an integer > 0, got -1", id="iter-neg"),
        pytest.param({"learning_rate": 0.0}, ValueError, r"learning_rate must be > 0", id="lr-0"),
        pytest.param({"learning_rate": -0.1}, ValueError, r"learning_rate must be > 0", id="lr-neg"),
        pytest.param(
            {"learning_rate": LearningRateSGD(eta0=-1)},
            ValueError,
            r"eta0 \(the learning rate\) must be a finite number > 0, got -1",
            id="eta0-neg",
        ),
        pytest.param(
            {"learning_rate": "RMSprop"}, ValueError, r"unknown learning_rate 'RMSprop'", id="lr-name"
        ),
        pytest.param({"device": "tpu"}, ValueError, r"unknown device 'tpu'", id="tpu"),
        pytest.param({"device": "cuda:x"}, ValueError, r"unknown device 'cuda:x'", id="cuda-x"),
        pytest.param({"device": 0}, TypeError, r"device must be a string", id="device-int"),
    ],
)
def test_bad_parameters_are_refused_and_train_nothing(fitted, linear_data, params, error, match):
    X, y = linear_data
    before = _snapshot(fitted)
    fitted.set_params(**params)
    with pytest.raises(error, match=match):
        fitted.fit(X, y)
    _assert_unchanged(fitted, before)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "CUDA:1"])
def test_cuda_with_the_cpu_build_names_the_cuda_extra(fitted, linear_data, device):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: the CPU-build message does not apply")
    X, y = linear_data
    before = _snapshot(fitted)
    fitted.set_params(device=device)
    installed = "onnxruntime-training-cpu" if TRAINING_BUILD else "onnxruntime"
    with pytest.raises(ValueError, match=rf"CUDA build.*pip uninstall -y {installed}\b") as info:
        fitted.fit(X, y)
    assert "pip install onnxruntime-training==1.19.2 nvidia-cuda-runtime-cu11==11.8.89 " in str(info.value)
    _assert_unchanged(fitted, before)


# ---- graphs that cannot be trained ------------------------------------------------------------


def _never_fitted(trainer: OrtGradientOptimizer) -> bool:
    return not hasattr(trainer, "n_iter_") and not hasattr(trainer, "train_losses_")


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        pytest.param(["coef", "missing"], r"weight 'missing' is not an initializer", id="missing"),
        pytest.param(["coef", "shape"], r"weight 'shape' is a INT64 tensor; only float tensors", id="int64"),
        pytest.param(["coef", "coef"], r"duplicates", id="duplicate"),
        pytest.param("coef", r"list of names, not the string", id="string"),
        pytest.param([], r"weights_to_train is empty: a trainer needs a weight to train", id="empty"),
    ],
)
def test_bad_weights_to_train(make_linear, linear_data, weights, match):
    # the linear model, then Reshape(Y, shape) with an int64 initializer 'shape' the loss needs
    model = make_linear()
    g = model.graph
    g.node[-1].output[0] = "Y_flat"
    g.node.append(helper.make_node("Reshape", ["Y_flat", "shape"], ["Y"]))
    g.initializer.append(numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), "shape"))
    onnx.checker.check_model(model)
    loss_model = add_loss_output(model)
    t = OrtGradientOptimizer(loss_model, weights_to_train=weights, max_iter=1)
    error = TypeError if isinstance(weights, str) else ValueError
    with pytest.raises(error, match=match):
        t.fit(*linear_data)
    assert _never_fitted(t)


def test_weight_the_loss_does_not_depend_on(make_linear, linear_data):
    model = make_linear()
    model.graph.initializer.append(numpy_helper.from_array(np.ones(3, dtype=np.float32), "unused"))
    t = OrtGradientOptimizer(add_loss_output(model), weights_to_train=["coef", "unused"])
    with pytest.raises(ValueError, match=r"does not depend on weight 'unused'"):
        t.fit(*linear_data)
    assert _never_fitted(t)


def test_model_without_the_loss_output(make_linear, linear_data):
    t = OrtGradientOptimizer(make_linear(), max_iter=1)
    with pytest.raises(
        ValueError, match=r"the model has no output 'loss' \(outputs: \['Y'\]\).*add_loss_output"
    ):
        t.fit(*linear_data)
    assert _never_fitted(t)
    t2 = OrtGradientOptimizer(add_loss_output(make_linear()), loss_output_name="objective")
    with pytest.raises(ValueError, match=r"no output 'objective'"):
        t2.fit(*linear_data)


def test_model_that_is_not_a_model_proto(linear_data):
    t = OrtGradientOptimizer(b"not a model")
    with pytest.raises(TypeError, match=r"model_onnx must be an onnx.ModelProto, not bytes"):
        t.fit(*linear_data)


def test_label_name_override_that_does_not_exist(linear_loss_model, linear_data):
    t = OrtGradientOptimizer(linear_loss_model, label_name="target")
    with pytest.raises(ValueError, match=r"the label input 'target' is not an input of the model"):
        t.fit(*linear_data)


# ---- divergence ---------------------------------------------------------------------------------


def test_divergence_raises_and_rolls_back_to_the_last_complete_epoch(linear_loss_model, linear_data):
    """Full-batch gradient descent with eta far above 1/L: the error is multiplied by about
    |1 - 2 eta lambda| each step, so the float32 loss overflows after a few epochs."""
    X, y = linear_data
    params = dict(max_iter=60, batch_size=5, learning_rate=2.0, random_state=3, shuffle=True)
    t = OrtGradientOptimizer(linear_loss_model, **params)
    with pytest.raises(ConvergenceError, match=r"loss became (inf|nan)") as info:
        t.fit(X, y)
    err = info.value
    assert 1 <= err.epoch < 60, "the test needs at least one complete epoch before divergence"
    assert t.n_iter_ == err.epoch
    assert len(t.train_losses_) == err.epoch
    assert np.isfinite(t.train_losses_).all()
    state = t.get_state()
    for value in state.values():
        assert np.isfinite(value).all()

    # the same fit stopped after the completed epochs reaches exactly that state
    t2 = OrtGradientOptimizer(linear_loss_model, **{**params, "max_iter": err.epoch})
    t2.fit(X, y)
    expected = t2.get_state()
    for name in expected:
        np.testing.assert_allclose(state[name], expected[name], rtol=1e-6)
    assert np.abs(expected["coef"]).max() > 1e3  # that state really is the diverging one

    # the rolled-back trainer is usable: its exported graph predicts with those weights
    import onnxruntime

    sess = onnxruntime.InferenceSession(
        t.get_trained_onnx().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (pred,) = sess.run(None, {"X": X[:4]})
    np.testing.assert_allclose(pred, X[:4].astype(np.float64) @ state["coef"] + state["intercept"], rtol=1e-4)
