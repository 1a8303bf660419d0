"""The shared fit loop of OrtGradientOptimizer: warm start, state, pickling, export,
validation, early stopping, verbosity, batches, parameters, CUDA, and what importing costs."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest

from ort_train_core import (
    ConvergenceError,
    ConvergenceWarning,
    LearningRateAdam,
    LearningRateSGD,
    OrtGradientOptimizer,
    add_loss_output,
)

SEED = 1234


def _assert_same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rtol: float = 1e-6) -> None:
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=1e-7, err_msg=name)


def _assert_close_to_reference(state: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(state) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(state[name], expected[name], rtol=2e-5, atol=2e-6, err_msg=name)


def _orders(seed: int, n: int, epochs: int) -> list[np.ndarray]:
    """The row orders DESIGN.md promises: a new permutation each epoch from default_rng(seed)."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(n) for _ in range(epochs)]


def _mse(pred: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None) -> float:
    rows = ((pred - np.asarray(y, dtype=np.float64).reshape(len(pred), -1)) ** 2).sum(axis=1)
    w = np.ones(len(rows)) if weight is None else np.asarray(weight, dtype=np.float64)
    return float((w * rows).sum() / w.sum())


# ---- warm start, state, pickling ------------------------------------------------------------------


@pytest.mark.parametrize(
    "learning_rate", ["SGD", "Adam", LearningRateSGD(eta0=0.05, learning_rate="optimal")]
)
def test_warm_start_continues_like_one_long_fit(mlp_loss_model, mlp_data, learning_rate):
    X, y = mlp_data
    X, y = X[:47], y[:47]  # 5 batches, the last one shorter
    params = dict(batch_size=10, learning_rate=learning_rate, shuffle=True, random_state=SEED)
    split = OrtGradientOptimizer(mlp_loss_model, max_iter=3, **params).fit(X, y)
    split.set_params(warm_start=True, max_iter=2)
    split.fit(X, y)
    whole = OrtGradientOptimizer(mlp_loss_model, max_iter=5, **params).fit(X, y)
    assert split.n_iter_ == whole.n_iter_ == 5
    _assert_same_state(split.get_state(), whole.get_state())
    np.testing.assert_allclose(split.train_losses_, whole.train_losses_, rtol=1e-6)
    # and it trained: the loss went down
    assert whole.train_losses_[-1] < whole.train_losses_[0]


def test_warm_start_follows_numpy_sgd_with_invscaling(linear_loss_model, linear_data, ref):
    """Epoch numbers carry over a warm start: eta0 / (t + 1) ** power_t with t = 0..4."""
    X, y = linear_data
    lr = LearningRateSGD(eta0=0.05, power_t=0.5)
    t = OrtGradientOptimizer(
        linear_loss_model, max_iter=2, batch_size=10, learning_rate=lr, random_state=SEED
    )
    t.fit(X, y)
    t.set_params(warm_start=True, max_iter=3)
    t.fit(X, y)
    expected, losses = ref.linear_sgd(
        ref.initializers(linear_loss_model),
        X,
        y,
        eta=lambda e: 0.05 / (e + 1) ** 0.5,
        batch_size=10,
        epochs=5,
        orders=_orders(SEED, len(X), 5),
    )
    _assert_close_to_reference(t.get_state(), expected)
    np.testing.assert_allclose(t.train_losses_, losses, rtol=2e-5)


def test_warm_start_refuses_a_changed_learning_rate(linear_loss_model, linear_data):
    t = OrtGradientOptimizer(linear_loss_model, max_iter=1, learning_rate=0.1).fit(*linear_data)
    t.set_params(warm_start=True, learning_rate=0.05)
    with pytest.raises(ValueError, match=r"learning rate changed"):
        t.fit(*linear_data)


def test_get_state_before_fit_is_the_initializers(linear_loss_model, ref):
    t = OrtGradientOptimizer(linear_loss_model)
    state = t.get_state()
    init = ref.initializers(linear_loss_model)
    assert list(state) == ["coef", "intercept"]
    for name in state:
        np.testing.assert_array_equal(state[name], init[name])
        assert state[name].dtype == np.float32


def test_get_state_returns_copies(linear_loss_model, linear_data):
    t = OrtGradientOptimizer(linear_loss_model, max_iter=1).fit(*linear_data)
    state = t.get_state()
    kept = state["coef"].copy()
    state["coef"][:] = 1e6
    np.testing.assert_array_equal(t.get_state()["coef"], kept)


def test_set_state_then_warm_fit_equals_continuing(linear_loss_model, linear_data, ref):
    X, y = linear_data
    params = dict(batch_size=10, learning_rate=0.05, shuffle=False)
    first = OrtGradientOptimizer(linear_loss_model, max_iter=3, **params).fit(X, y)
    saved = first.get_state()
    first.set_params(warm_start=True, max_iter=2)
    first.fit(X, y)

    other = OrtGradientOptimizer(linear_loss_model, max_iter=2, warm_start=True, **params)
    other.set_state(saved)
    _assert_same_state(other.get_state(), saved)
    other.fit(X, y)
    _assert_same_state(other.get_state(), first.get_state())
    np.testing.assert_allclose(other.train_losses_, first.train_losses_[3:], rtol=1e-6)

    expected, losses = ref.linear_sgd(saved, X, y, eta=0.05, batch_size=10, epochs=2)
    _assert_close_to_reference(other.get_state(), expected)
    np.testing.assert_allclose(other.train_losses_, losses, rtol=2e-5)


def test_set_state_of_one_weight(linear_loss_model, ref):
    t = OrtGradientOptimizer(linear_loss_model)
    t.set_state({"intercept": [3.0]})
    state = t.get_state()
    np.testing.assert_array_equal(state["intercept"], np.array([3.0], dtype=np.float32))
    assert state["intercept"].dtype == np.float32
    np.testing.assert_array_equal(state["coef"], ref.initializers(linear_loss_model)["coef"])


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"nope": np.zeros(1)}, r"unknown weight 'nope'"),
        ({"coef": np.zeros((3,))}, r"weight 'coef' must have shape \(3, 1\), got \(3,\)"),
        ({"intercept": [np.nan]}, r"weight 'intercept' must hold finite numbers"),
        ({"intercept": ["a"]}, r"weight 'intercept' must hold finite numbers"),
    ],
)
def test_set_state_refuses_bad_values(linear_loss_model, state, match):
    t = OrtGradientOptimizer(linear_loss_model)
    before = t.get_state()
    with pytest.raises(ValueError, match=match):
        t.set_state(state)
    _assert_same_state(t.get_state(), before)


def test_pickled_trainer_continues_identically(mlp_loss_model, mlp_data):
    X, y = mlp_data
    t = OrtGradientOptimizer(
        mlp_loss_model,
        max_iter=3,
        batch_size=8,
        learning_rate=LearningRateAdam(eta0=0.01),
        shuffle=True,
        random_state=SEED,
    ).fit(X, y)
    blob = pickle.dumps(t)
    t.set_params(warm_start=True, max_iter=2)
    t.fit(X, y)

    restored = pickle.loads(blob)
    assert restored.n_iter_ == 3
    restored.set_params(warm_start=True, max_iter=2)
    restored.fit(X, y)
    assert restored.n_iter_ == t.n_iter_ == 5
    _assert_same_state(restored.get_state(), t.get_state())
    np.testing.assert_allclose(restored.train_losses_, t.train_losses_, rtol=1e-6)
    # Adam's moments travelled too: a restart from the same weights without them differs
    fresh = OrtGradientOptimizer(
        mlp_loss_model,
        max_iter=2,
        batch_size=8,
        learning_rate=LearningRateAdam(eta0=0.01),
        shuffle=True,
        random_state=SEED,
        warm_start=True,
    )
    fresh.set_state(pickle.loads(blob).get_state())
    fresh.fit(X, y)
    assert not np.allclose(fresh.get_state()["W1"], t.get_state()["W1"], rtol=1e-6, atol=0)


def test_unfitted_trainer_pickles(linear_loss_model, linear_data, ref):
    t = pickle.loads(
        pickle.dumps(OrtGradientOptimizer(linear_loss_model, max_iter=2, learning_rate=0.05, shuffle=False))
    )
    t.fit(*linear_data)
    expected, _ = ref.linear_sgd(
        ref.initializers(linear_loss_model), *linear_data, eta=0.05, batch_size=10, epochs=2
    )
    _assert_close_to_reference(t.get_state(), expected)


# ---- export -----------------------------------------------------------------------------------------


def test_get_trained_onnx_predicts_like_numpy(mlp_loss_model, mlp_data, ref):
    X, y = mlp_data
    t = OrtGradientOptimizer(mlp_loss_model, max_iter=4, learning_rate=0.02, random_state=0).fit(X, y)
    model = t.get_trained_onnx()
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 10
    assert [i.name for i in model.graph.input] == ["X"]
    assert [o.name for o in model.graph.output] == ["Y"]
    assert not [p for p in model.metadata_props if p.key.startswith("ort_train.")]
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (pred,) = sess.run(None, {"X": X})
    state = t.get_state()
    assert not np.array_equal(state["W1"], ref.initializers(mlp_loss_model)["W1"])
    np.testing.assert_allclose(pred, ref.mlp_forward(state, X), rtol=1e-5, atol=1e-5)


def test_save_onnx_graph_writes_loadable_files(mlp_loss_model, mlp_data, ref, tmp_path):
    X, y = mlp_data
    t = OrtGradientOptimizer(mlp_loss_model, max_iter=2, batch_size=16).fit(X, y)
    folder = tmp_path / "new" / "folder"
    paths = t.save_onnx_graph(folder)
    assert "trained" in paths
    assert len(paths) >= 2
    for path in paths.values():
        assert os.path.dirname(path) == str(folder)
        loaded = onnx.load(path)
        assert loaded.ir_version <= 10
        assert len(loaded.graph.node) > 0
    trained = onnx.load(paths["trained"])
    sess = onnxruntime.InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    (pred,) = sess.run(None, {"X": X})
    np.testing.assert_allclose(pred, ref.mlp_forward(t.get_state(), X), rtol=1e-5, atol=1e-5)


# ---- validation and early stopping -----------------------------------------------------------------


def test_validation_divergence_rolls_back_the_epoch_and_its_history(linear_loss_model, linear_data):
    """A validation loss that overflows (float32) after a warm-started epoch: the weights, the
    epoch count and the histories are those of the epochs kept, so that the next warm start
    continues as if the failed epoch never ran."""
    X, y = linear_data
    trainer = OrtGradientOptimizer(linear_loss_model, max_iter=2, learning_rate=0.01, warm_start=True)
    kept = trainer.fit(X, y).get_state()
    losses = list(trainer.train_losses_)
    with pytest.raises(ConvergenceError, match="validation loss became inf at epoch 3"):
        trainer.fit(X, y, X_val=X[:5] * np.float32(1e30), y_val=y[:5])
    assert trainer.n_iter_ == 2
    assert trainer.train_losses_ == losses
    assert trainer.validation_losses_ == []
    _assert_same_state(trainer.get_state(), kept, rtol=0)


def test_divergence_at_an_epochs_first_batch_rolls_back_to_weights_with_a_finite_loss(
    linear_loss_model, linear_data
):
    """One batch an epoch: an epoch's first loss is that of the previous epoch's end weights,
    so an inf there condemns those weights themselves; the rollback goes one epoch further
    back, to weights whose loss (numpy's float32 squared error) is finite, and the history
    loses that epoch too."""
    X, y = linear_data
    Xs = X * np.float32(1e3)
    params = dict(max_iter=60, batch_size=len(X), learning_rate=1.0, shuffle=False)
    t = OrtGradientOptimizer(linear_loss_model, **params)
    with pytest.raises(
        ConvergenceError, match=r"batch 1: weights were restored to the end of the epoch before"
    ) as info:
        t.fit(Xs, y)
    err = info.value
    assert err.batch == 0
    assert err.epoch >= 2
    assert t.n_iter_ == len(t.train_losses_) == err.epoch - 1

    def numpy_loss(state: dict[str, np.ndarray]) -> np.float32:
        pred = Xs @ state["coef"].astype(np.float32) + state["intercept"].astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.mean((pred.ravel() - y) ** 2, dtype=np.float32)

    assert np.isfinite(numpy_loss(t.get_state()))
    # the weights of the epoch in between, rolled back too, overflow the float32 loss
    between = OrtGradientOptimizer(linear_loss_model, **{**params, "max_iter": err.epoch}).fit(Xs, y)
    assert not np.isfinite(numpy_loss(between.get_state()))
    # the state kept is that of the same fit stopped one epoch earlier
    kept = OrtGradientOptimizer(linear_loss_model, **{**params, "max_iter": err.epoch - 1}).fit(Xs, y)
    _assert_same_state(t.get_state(), kept.get_state(), rtol=0)


def test_a_checkpoint_after_such_a_divergence_holds_the_kept_weights(
    linear_loss_model, linear_data, tmp_path
):
    """The checkpoint written at every epoch end held the condemned weights after the rollback
    went one epoch further back: on_train_end rewrites it with the state the trainer kept (its
    weights, epoch count and history), which resumes without diverging at once."""
    from ort_train_core.checkpoint import CHECKPOINT_FILE, checkpoint_info

    X, y = linear_data
    Xs = X * np.float32(1e3)
    params = dict(max_iter=60, batch_size=len(X), learning_rate=1.0, shuffle=False)
    t = OrtGradientOptimizer(linear_loss_model, checkpoint_dir=str(tmp_path), **params)
    with pytest.raises(ConvergenceError, match="the end of the epoch before the last") as info:
        t.fit(Xs, y)
    saved = checkpoint_info(tmp_path / CHECKPOINT_FILE)
    assert saved["n_iter_"] == t.n_iter_ == info.value.epoch - 1
    again = OrtGradientOptimizer(
        linear_loss_model, checkpoint_dir=str(tmp_path), **{**params, "max_iter": t.n_iter_ + 1}
    )
    again.resume(Xs, y)  # one more epoch from the kept weights: its first loss is finite
    assert again.n_iter_ == t.n_iter_ + 1
    assert np.isfinite(again.train_losses_).all()


def test_validation_loss_is_the_numpy_loss_at_each_epoch_end(linear_loss_model, linear_data, ref):
    X, y = linear_data
    rng = np.random.default_rng(5)
    X_val = rng.standard_normal((11, 3)).astype(np.float32)
    y_val = rng.standard_normal(11).astype(np.float32)
    t = OrtGradientOptimizer(linear_loss_model, max_iter=1, batch_size=10, learning_rate=0.05, random_state=0)
    for epoch in range(4):
        if epoch:
            t.set_params(warm_start=True)
        t.fit(X, y, X_val=X_val, y_val=y_val)
        assert len(t.validation_losses_) == t.n_iter_ == epoch + 1
        expected = _mse(ref.linear_forward(t.get_state(), X_val), y_val)
        assert t.validation_losses_[-1] == pytest.approx(expected, rel=1e-5)
    assert len(set(t.validation_losses_)) == 4  # the weights moved between epochs

    one = OrtGradientOptimizer(
        linear_loss_model, max_iter=4, batch_size=10, learning_rate=0.05, random_state=0
    )
    one.fit(X, y, X_val=X_val, y_val=y_val)
    assert len(one.validation_losses_) == one.n_iter_ == 4
    np.testing.assert_allclose(one.validation_losses_, t.validation_losses_, rtol=1e-6)


def test_weighted_validation_loss(weighted_linear_loss_model, linear_data, ref):
    X, y = linear_data
    w = np.linspace(0.1, 2.0, len(X))
    t = OrtGradientOptimizer(weighted_linear_loss_model, max_iter=2, learning_rate=0.05, random_state=0)
    t.fit(X, y, sample_weight=w, X_val=X[:9], y_val=y[:9] + 1, sample_weight_val=w[:9])
    expected = _mse(ref.linear_forward(t.get_state(), X[:9]), y[:9] + 1, w[:9])
    assert t.validation_losses_[-1] == pytest.approx(expected, rel=1e-5)
    # without validation weights every validation row counts once
    t.set_params(warm_start=True, max_iter=1)
    t.fit(X, y, sample_weight=w, X_val=X[:9], y_val=y[:9] + 1)
    expected = _mse(ref.linear_forward(t.get_state(), X[:9]), y[:9] + 1)
    assert t.validation_losses_[-1] == pytest.approx(expected, rel=1e-5)


def _sklearn_stop_epoch(losses: list[float], tol: float, patience: int) -> int | None:
    """scikit-learn's rule (SGD/MLP): count epochs whose loss is not below best - tol."""
    best, bad = np.inf, 0
    for epoch, loss in enumerate(losses):
        bad = bad + 1 if loss > best - tol else 0
        best = min(best, loss)
        if bad >= patience:
            return epoch + 1
    return None


def test_early_stopping_on_a_converged_problem(linear_loss_model, linear_data):
    X, y = linear_data
    t = OrtGradientOptimizer(
        linear_loss_model,
        max_iter=500,
        batch_size=10,
        learning_rate=0.1,
        random_state=0,
        tol=1e-6,
        n_iter_no_change=3,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ConvergenceWarning when it stopped
        t.fit(X, y)
    assert t.n_iter_ < 500
    assert len(t.train_losses_) == t.n_iter_
    assert _sklearn_stop_epoch(t.train_losses_, 1e-6, 3) == t.n_iter_
    # it had converged: the noise-free coefficients are found
    state = t.get_state()
    np.testing.assert_allclose(state["coef"].ravel(), [1.5, -2.0, 0.5], atol=5e-3)
    np.testing.assert_allclose(state["intercept"], [0.25], atol=5e-3)


def test_early_stopping_monitors_the_validation_loss(linear_loss_model, linear_data):
    """A validation target unrelated to X stops improving long before the training loss."""
    X, y = linear_data
    rng = np.random.default_rng(0)
    X_val, y_val = X[:10], rng.standard_normal(10).astype(np.float32) * 5
    t = OrtGradientOptimizer(
        linear_loss_model,
        max_iter=200,
        batch_size=10,
        learning_rate=0.05,
        random_state=0,
        tol=1e-3,
        n_iter_no_change=2,
    )
    t.fit(X, y, X_val=X_val, y_val=y_val)
    assert _sklearn_stop_epoch(t.validation_losses_, 1e-3, 2) == t.n_iter_
    assert _sklearn_stop_epoch(t.train_losses_, 1e-3, 2) is None


def test_convergence_warning_when_max_iter_comes_first(linear_loss_model, linear_data):
    X, y = linear_data
    t = OrtGradientOptimizer(
        linear_loss_model,
        max_iter=3,
        learning_rate=0.01,
        random_state=0,
        tol=1e-4,
        n_iter_no_change=5,
    )
    with pytest.warns(ConvergenceWarning, match=r"max_iter=3 reached"):
        t.fit(X, y)
    assert t.n_iter_ == 3
    assert t.train_losses_[-1] < t.train_losses_[0]


# ---- verbosity --------------------------------------------------------------------------------------


def test_verbose_2_prints_one_line_per_epoch(linear_loss_model, linear_data, capsys):
    X, y = linear_data
    t = OrtGradientOptimizer(linear_loss_model, max_iter=4, verbose=2, learning_rate=0.05, random_state=0)
    t.fit(X, y, X_val=X, y_val=y)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4
    for epoch, line in enumerate(lines):
        assert f"epoch {epoch + 1}" in line
        assert f"train_loss={t.train_losses_[epoch]:.6g}" in line
        assert "validation_loss=" in line


def test_verbose_0_prints_nothing(linear_loss_model, linear_data, capsys):
    OrtGradientOptimizer(linear_loss_model, max_iter=3).fit(*linear_data)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ""


def test_verbose_1_shows_a_progress_bar(linear_loss_model, linear_data, capsys):
    t = OrtGradientOptimizer(linear_loss_model, max_iter=3, verbose=1, learning_rate=0.05)
    t.fit(*linear_data)
    err = capsys.readouterr().err
    assert "3/3" in err
    assert t.n_iter_ == 3
    pickle.loads(pickle.dumps(t))  # a trainer that showed a bar still pickles


# ---- batches ------------------------------------------------------------------------------------------


def test_shuffle_is_reproducible_and_follows_default_rng(linear_loss_model, linear_data, ref):
    X, y = linear_data
    params = dict(max_iter=3, batch_size=5, learning_rate=0.05, shuffle=True)
    a = OrtGradientOptimizer(linear_loss_model, random_state=SEED, **params).fit(X, y)
    b = OrtGradientOptimizer(linear_loss_model, random_state=SEED, **params).fit(X, y)
    c = OrtGradientOptimizer(linear_loss_model, random_state=SEED + 1, **params).fit(X, y)
    _assert_same_state(a.get_state(), b.get_state(), rtol=0)
    assert a.train_losses_ == b.train_losses_
    assert not np.allclose(a.get_state()["coef"], c.get_state()["coef"], rtol=1e-6, atol=0)
    for trainer, seed in ((a, SEED), (c, SEED + 1)):
        expected, losses = ref.linear_sgd(
            ref.initializers(linear_loss_model),
            X,
            y,
            eta=0.05,
            batch_size=5,
            epochs=3,
            orders=_orders(seed, len(X), 3),
        )
        _assert_close_to_reference(trainer.get_state(), expected)
        np.testing.assert_allclose(trainer.train_losses_, losses, rtol=2e-5)


@pytest.mark.parametrize("shuffle", [False, True])
def test_last_batch_shorter_than_batch_size(linear_loss_model, linear_data, ref, shuffle):
    X, y = linear_data
    assert len(X) == 23
    t = OrtGradientOptimizer(
        linear_loss_model,
        max_iter=3,
        batch_size=10,
        learning_rate=0.05,
        shuffle=shuffle,
        random_state=SEED,
    ).fit(X, y)
    expected, losses = ref.linear_sgd(
        ref.initializers(linear_loss_model),
        X,
        y,
        eta=0.05,
        batch_size=10,
        epochs=3,
        orders=_orders(SEED, len(X), 3) if shuffle else None,
    )
    _assert_close_to_reference(t.get_state(), expected)
    np.testing.assert_allclose(t.train_losses_, losses, rtol=2e-5)


def test_batch_size_larger_than_the_data(linear_loss_model, linear_data, ref):
    X, y = linear_data
    t = OrtGradientOptimizer(linear_loss_model, max_iter=2, batch_size=100, learning_rate=0.05).fit(X, y)
    # one batch holding every row (shuffled: the order does not change a full-batch step)
    expected, _ = ref.linear_sgd(ref.initializers(linear_loss_model), X, y, eta=0.05, batch_size=23, epochs=2)
    _assert_close_to_reference(t.get_state(), expected)


# ---- parameters -------------------------------------------------------------------------------------


def test_set_params_then_fit(linear_loss_model, linear_data, ref):
    X, y = linear_data
    t = OrtGradientOptimizer(linear_loss_model, max_iter=2, learning_rate=0.1, shuffle=False).fit(X, y)
    assert t.set_params(learning_rate=0.05) is t
    assert t.get_params()["learning_rate"] == 0.05
    assert t.get_params(deep=False)["learning_rate"] == 0.05
    t.fit(X, y)
    expected, _ = ref.linear_sgd(ref.initializers(linear_loss_model), X, y, eta=0.05, batch_size=10, epochs=2)
    _assert_close_to_reference(t.get_state(), expected)
    with pytest.raises(ValueError, match=r"invalid parameter 'learning_rat'"):
        t.set_params(learning_rat=0.1)


def test_nested_params_of_a_learning_rate_object(linear_loss_model, linear_data, ref):
    X, y = linear_data
    t = OrtGradientOptimizer(
        linear_loss_model,
        max_iter=2,
        shuffle=False,
        learning_rate=LearningRateSGD(eta0=0.1, learning_rate="constant"),
    )
    assert t.get_params()["learning_rate__eta0"] == 0.1
    t.set_params(learning_rate__eta0=0.03)
    assert t.get_params()["learning_rate__eta0"] == 0.03
    t.fit(X, y)
    expected, _ = ref.linear_sgd(ref.initializers(linear_loss_model), X, y, eta=0.03, batch_size=10, epochs=2)
    _assert_close_to_reference(t.get_state(), expected)


def test_clone_from_get_params(linear_loss_model, linear_data, ref):
    X, y = linear_data
    t = OrtGradientOptimizer(
        linear_loss_model, max_iter=2, batch_size=5, learning_rate=0.05, random_state=SEED
    )
    t.fit(X, y)
    params = t.get_params(deep=False)
    assert {
        "model_onnx",
        "weights_to_train",
        "max_iter",
        "batch_size",
        "learning_rate",
        "device",
        "warm_start",
        "verbose",
        "shuffle",
        "random_state",
    } <= set(params)
    clone = type(t)(**params)
    assert not hasattr(clone, "n_iter_")
    assert clone.get_params(deep=False).keys() == params.keys()
    clone.fit(X, y)
    expected, _ = ref.linear_sgd(
        ref.initializers(linear_loss_model),
        X,
        y,
        eta=0.05,
        batch_size=5,
        epochs=2,
        orders=_orders(SEED, len(X), 2),
    )
    _assert_close_to_reference(clone.get_state(), expected)
    _assert_close_to_reference(t.get_state(), expected)


def test_sklearn_clone(linear_loss_model):
    from sklearn.base import clone

    t = OrtGradientOptimizer(linear_loss_model, max_iter=7, learning_rate=LearningRateAdam(eta0=0.02))
    c = clone(t)
    assert c is not t
    assert c.max_iter == 7
    assert c.learning_rate.eta0 == 0.02
    assert c.learning_rate is not t.learning_rate
    assert "max_iter=7" in repr(c)


# ---- CUDA ---------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_training_on_cuda_matches_numpy(make_linear, linear_data, ref):
    X, y = linear_data
    model = add_loss_output(make_linear())
    t = OrtGradientOptimizer(
        model, device="cuda", max_iter=3, batch_size=10, learning_rate=0.05, random_state=SEED
    ).fit(X, y, X_val=X, y_val=y)
    expected, losses = ref.linear_sgd(
        ref.initializers(model), X, y, eta=0.05, batch_size=10, epochs=3, orders=_orders(SEED, len(X), 3)
    )
    _assert_close_to_reference(t.get_state(), expected)
    np.testing.assert_allclose(t.train_losses_, losses, rtol=1e-4)
    assert t.validation_losses_[-1] == pytest.approx(_mse(ref.linear_forward(t.get_state(), X), y), rel=1e-4)


# ---- import time ----------------------------------------------------------------------------------


def _run_python(code: str, extra_path: str | None = None) -> dict:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


_IMPORT_AND_REPORT = """
    import json, sys
    {prelude}
    try:
        import ort_train_core
    except BaseException as exc:
        print(json.dumps({{
            "type": type(exc).__name__, "module": type(exc).__module__,
            "import_error": isinstance(exc, ImportError), "message": str(exc),
        }}))
    else:
        print(json.dumps({{"type": None, "torch": "torch" in sys.modules,
                           "training": "onnxruntime.training" in sys.modules}}))
"""


def test_import_does_not_load_torch():
    out = _run_python(_IMPORT_AND_REPORT.format(prelude=""))
    assert out["type"] is None
    assert out["torch"] is False


def _assert_training_runtime_error(out: dict) -> None:
    assert out["type"] == "TrainingRuntimeError"
    assert out["module"] == "ort_train_core.exceptions"
    assert out["import_error"] is True
    assert "pip install" in out["message"]
    from ort_train_core._runtime import has_training_wheel

    # the runtime itself: ort-train-core is installed (from a clone: it is not on PyPI)
    fix = "onnxruntime-training-cpu==1.19.2" if has_training_wheel() else '"onnxruntime>=1.20"'
    assert f"pip install {fix}" in out["message"]


def test_import_with_a_non_training_onnxruntime(tmp_path):
    """Plain onnxruntime installed over the training build: same folder, no training classes."""
    pkg = tmp_path / "onnxruntime"
    (pkg / "capi").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "capi" / "__init__.py").write_text("")
    (pkg / "capi" / "_pybind_state.py").write_text("")
    (pkg / "capi" / "build_and_package_info.py").write_text("package_name = 'onnxruntime'\n")
    out = _run_python(_IMPORT_AND_REPORT.format(prelude=""), extra_path=str(tmp_path))
    _assert_training_runtime_error(out)
    assert "'onnxruntime'" in out["message"]


def test_import_without_onnxruntime():
    out = _run_python(_IMPORT_AND_REPORT.format(prelude="sys.modules['onnxruntime'] = None"))
    _assert_training_runtime_error(out)
    assert "cannot be imported" in out["message"]
