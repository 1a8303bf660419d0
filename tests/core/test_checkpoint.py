"""Checkpoints: a fit stopped after epoch k (by max_iter or Ctrl-C) and resumed from its
checkpoint ends with the weights of an uninterrupted fit, for both loops, with shuffling, Adam
and SGD-Nesterov; the file is a pickle-free .npz written atomically; another model's checkpoint
is refused."""

from __future__ import annotations

import io
import os
import pickle
import re
import signal
import tracemalloc
import zipfile
from typing import Any

import numpy as np
import pytest
from core_models import build_linear, build_mlp, linear_sgd_reference
from onnx import numpy_helper

from ort_train_core import (
    Callback,
    ConvergenceWarning,
    LearningRateAdam,
    LearningRateSGDNesterov,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core.checkpoint import CHECKPOINT_FILE, checkpoint_info, read_checkpoint, write_checkpoint

N_EPOCHS = 6


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    X = rng.standard_normal((37, 4)).astype(np.float32)
    y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]).astype(np.float32)
    return X, y


def _trainer(loop: str, lr: str, **kwargs: Any) -> Any:
    learning_rate = (
        LearningRateAdam(eta0=0.01)
        if lr == "adam"
        else LearningRateSGDNesterov(eta0=0.01, learning_rate="invscaling", momentum=0.8)
    )
    common = dict(batch_size=8, learning_rate=learning_rate, shuffle=True, random_state=11, **kwargs)
    if loop == "full":
        return OrtGradientOptimizer(add_loss_output(build_mlp(4, 5, seed=2)), **common)
    return OrtGradientForwardBackwardOptimizer(build_mlp(4, 5, seed=2), **common)


def _assert_same_fit(a: Any, b: Any) -> None:
    assert a.n_iter_ == b.n_iter_
    np.testing.assert_allclose(a.train_losses_, b.train_losses_, rtol=0, atol=1e-6)
    sa, sb = a.get_state(), b.get_state()
    assert sorted(sa) == sorted(sb)
    for name in sa:
        np.testing.assert_allclose(sa[name], sb[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("lr", ["adam", "nesterov"])
@pytest.mark.parametrize("loop", ["full", "partial"])
def test_resume_after_max_iter_equals_uninterrupted(tmp_path, loop, lr):
    X, y = _data()
    straight = _trainer(loop, lr, max_iter=N_EPOCHS).fit(X, y)
    first = _trainer(loop, lr, max_iter=2, checkpoint_dir=tmp_path).fit(X, y)
    assert checkpoint_info(tmp_path / CHECKPOINT_FILE)["n_iter_"] == 2
    assert first.n_iter_ == 2
    resumed = _trainer(loop, lr, max_iter=N_EPOCHS, checkpoint_dir=tmp_path)
    resumed.resume(X, y)
    _assert_same_fit(resumed, straight)
    info = checkpoint_info(tmp_path / CHECKPOINT_FILE)
    assert info["n_iter_"] == N_EPOCHS
    assert info["n_steps"] == N_EPOCHS * 5  # 37 rows, batches of 8


class _CtrlCAfterEpoch(Callback):
    """Sends SIGINT at the end of an epoch: the loop stops one step into the next one."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, float]) -> bool:
        if epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGINT)
        return False


@pytest.mark.parametrize("loop", ["full", "partial"])
def test_ctrl_c_checkpoint_is_the_last_epoch_end(tmp_path, loop):
    X, y = _data()
    X_val, y_val = X[:9] + 0.1, y[:9]
    straight = _trainer(loop, "adam", max_iter=N_EPOCHS).fit(X, y, X_val=X_val, y_val=y_val)
    stopped = _trainer(
        loop, "adam", max_iter=N_EPOCHS, checkpoint_dir=tmp_path, callbacks=[_CtrlCAfterEpoch(2)]
    )
    with pytest.warns(RuntimeWarning, match="interrupted"):
        stopped.fit(X, y, X_val=X_val, y_val=y_val)
    info = checkpoint_info(tmp_path / CHECKPOINT_FILE)
    # three complete epochs; the step taken into the fourth is not in the checkpoint
    assert (info["n_iter_"], info["n_steps"]) == (3, 15)
    assert stopped.n_iter_ == 3
    resumed = _trainer(loop, "adam", max_iter=N_EPOCHS, checkpoint_dir=tmp_path)
    resumed.resume(X, y, X_val=X_val, y_val=y_val)
    _assert_same_fit(resumed, straight)
    np.testing.assert_allclose(resumed.validation_losses_, straight.validation_losses_, atol=1e-6)


def test_resume_matches_numpy_sgd_with_the_shuffled_orders(tmp_path, linear_data):
    """Independent reference: numpy SGD over the permutations default_rng(seed) draws."""
    X, y = linear_data
    model = build_linear()
    w0 = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    kwargs = dict(batch_size=5, learning_rate=0.02, shuffle=True, random_state=4, checkpoint_dir=tmp_path)
    OrtGradientOptimizer(add_loss_output(model), max_iter=2, **kwargs).fit(X, y)
    trainer = OrtGradientOptimizer(add_loss_output(model), max_iter=5, **kwargs).resume(X, y)
    rng = np.random.default_rng(4)
    orders = [rng.permutation(len(X)) for _ in range(5)]
    ref, history = linear_sgd_reference(w0, X, y, eta=0.02, batch_size=5, epochs=5, orders=orders)
    state = trainer.get_state()
    for name in ref:
        np.testing.assert_allclose(state[name], ref[name], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(trainer.train_losses_, history, rtol=1e-5)


def test_a_fit_that_raises_leaves_its_last_epoch_end(tmp_path):
    """The checkpoint is written when the fit ends, also by an error: a callback failing after
    epoch 3 (checkpoint_every=10: nothing written before) leaves epoch 3, and resume() ends at
    the weights of an uninterrupted fit."""
    X, y = _data()
    straight = _trainer("full", "adam", max_iter=N_EPOCHS).fit(X, y)

    class Fail(Callback):
        def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, float]) -> bool:
            if epoch == 2:
                raise RuntimeError("callback failed")
            return False

    failing = _trainer("full", "adam", max_iter=N_EPOCHS, checkpoint_dir=tmp_path, checkpoint_every=10)
    with pytest.raises(RuntimeError, match="callback failed"):
        failing.set_params(callbacks=[Fail()]).fit(X, y)
    info = checkpoint_info(tmp_path / CHECKPOINT_FILE)
    assert (info["n_iter_"], info["n_steps"], len(info["train_losses_"])) == (3, 15, 3)
    resumed = _trainer("full", "adam", max_iter=N_EPOCHS, checkpoint_dir=tmp_path).resume(X, y)
    _assert_same_fit(resumed, straight)


def test_checkpoint_every_and_end_of_fit(tmp_path):
    X, y = _data()
    seen: list[int] = []

    class Spy(Callback):
        def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, float]) -> bool:
            path = tmp_path / CHECKPOINT_FILE
            seen.append(checkpoint_info(path)["n_iter_"] if path.exists() else 0)
            return False

    _trainer("full", "adam", max_iter=5, checkpoint_dir=tmp_path, checkpoint_every=2, callbacks=[Spy()]).fit(
        X, y
    )
    assert seen == [0, 2, 2, 4, 4]
    assert checkpoint_info(tmp_path / CHECKPOINT_FILE)["n_iter_"] == 5  # written at the end too
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_FILE]  # no temporary file left


def test_file_is_pickle_free_npz_with_json(tmp_path):
    X, y = _data()
    trainer = _trainer("partial", "nesterov", max_iter=2).fit(X, y)
    path = tmp_path / "sub" / "state.npz"
    trainer.save_checkpoint(path)
    with zipfile.ZipFile(path) as z:
        assert all(n.endswith(".npy") for n in z.namelist())
    arrays, meta = read_checkpoint(path)
    assert all(a.dtype != object for a in arrays.values())
    assert meta["weights"] == list(trainer.get_state())
    assert meta["n_iter_"] == 2
    assert meta["train_losses_"] == trainer.train_losses_
    assert meta["rng"]["bit_generator"] == "PCG64"
    state = trainer.get_state()
    for i, name in enumerate(meta["weights"]):
        np.testing.assert_array_equal(arrays[f"w{i}"], state[name])
    # velocity of each weight (momentum) is saved
    assert meta["n_states"] == [1] * len(state)


def test_load_checkpoint_restores_everything(tmp_path):
    X, y = _data()
    a = _trainer("full", "adam", max_iter=3).fit(X, y)
    a.save_checkpoint(tmp_path / "a.npz")
    b = _trainer("full", "adam", max_iter=3)
    b.load_checkpoint(tmp_path / "a.npz")
    assert b.n_iter_ == 3
    assert b.train_losses_ == a.train_losses_
    assert b._state.n_steps == a._state.n_steps
    assert b._rng.bit_generator.state == a._rng.bit_generator.state
    _assert_same_fit(b, a)
    # a warm-started fit continues the same way from both
    a.set_params(warm_start=True)
    b.set_params(warm_start=True)
    _assert_same_fit(b.fit(X, y), a.fit(X, y))


def test_checkpoint_of_another_model_is_refused(tmp_path):
    X, y = _data()
    _trainer("full", "adam", max_iter=1, checkpoint_dir=tmp_path).fit(X, y)
    other = OrtGradientOptimizer(
        add_loss_output(build_mlp(4, 7, seed=2)),
        learning_rate=LearningRateAdam(eta0=0.01),
        checkpoint_dir=tmp_path,
    )
    with pytest.raises(ValueError, match="checkpoint of another model"):
        other.resume(X, y)
    with pytest.raises(ValueError, match="checkpoint of another model"):
        other.load_checkpoint(tmp_path / CHECKPOINT_FILE)


def test_resume_refuses_another_learning_rate(tmp_path):
    X, y = _data()
    _trainer("full", "adam", max_iter=1, checkpoint_dir=tmp_path).fit(X, y)
    other = _trainer("full", "nesterov", max_iter=3, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="learning rate changed"):
        other.resume(X, y)


def test_not_a_checkpoint(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    trainer = _trainer("full", "adam")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        trainer.load_checkpoint(bad)
    np.savez(tmp_path / "plain.npz", a=np.zeros(2))
    with pytest.raises(ValueError, match="not an ort-train checkpoint"):
        trainer.load_checkpoint(tmp_path / "plain.npz")
    with pytest.raises(FileNotFoundError):
        trainer.load_checkpoint(tmp_path / "missing.npz")


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    X, y = _data()
    trainer = _trainer("full", "adam", max_iter=2, checkpoint_dir=tmp_path).fit(X, y)
    before = (tmp_path / CHECKPOINT_FILE).read_bytes()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint(tmp_path / CHECKPOINT_FILE)
    assert (tmp_path / CHECKPOINT_FILE).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_FILE]


def test_resume_without_checkpoint_is_a_fit_and_a_finished_one_does_nothing(tmp_path):
    X, y = _data()
    straight = _trainer("partial", "adam", max_iter=3).fit(X, y)
    resumed = _trainer("partial", "adam", max_iter=3, checkpoint_dir=tmp_path).resume(X, y)
    _assert_same_fit(resumed, straight)
    again = _trainer("partial", "adam", max_iter=3, checkpoint_dir=tmp_path).resume(X, y)
    _assert_same_fit(again, straight)


def test_resume_keeps_early_stopping_counters(tmp_path):
    """The early-stopping state is rebuilt from the loss history: same stopping epoch."""
    X, y = _data()
    # only the first epoch improves on inf by tol=10: three more, then stop (at 4, not 2 + 4)
    kwargs = dict(max_iter=40, tol=10.0, n_iter_no_change=3)
    straight = _trainer("full", "adam", **kwargs).fit(X, y)
    assert straight.n_iter_ == 4
    with pytest.warns(ConvergenceWarning, match="max_iter=2 reached"):
        _trainer("full", "adam", **{**kwargs, "max_iter": 2}, checkpoint_dir=tmp_path).fit(X, y)
    resumed = _trainer("full", "adam", **kwargs, checkpoint_dir=tmp_path).resume(X, y)
    _assert_same_fit(resumed, straight)
    # resuming a run that had stopped early trains nothing more
    again = _trainer("full", "adam", **kwargs, checkpoint_dir=tmp_path).resume(X, y)
    _assert_same_fit(again, straight)


def test_parameters_are_validated_at_fit(tmp_path):
    X, y = _data()
    with pytest.raises(ValueError, match="checkpoint_every"):
        _trainer("full", "adam", max_iter=1, checkpoint_dir=tmp_path, checkpoint_every=0).fit(X, y)
    with pytest.raises(TypeError, match="checkpoint_dir"):
        _trainer("full", "adam", max_iter=1, checkpoint_dir=3).fit(X, y)
    with pytest.raises(ValueError, match="set checkpoint_dir"):
        _trainer("full", "adam", max_iter=1).resume(X, y)
    with pytest.raises(ValueError, match="fit the trainer"):
        _trainer("full", "adam").save_checkpoint(tmp_path / "x.npz")


def test_pickled_trainer_keeps_checkpoint_parameters(tmp_path):
    X, y = _data()
    trainer = _trainer("partial", "adam", max_iter=2, checkpoint_dir=str(tmp_path), checkpoint_every=2).fit(
        X, y
    )
    copy = pickle.loads(pickle.dumps(trainer))
    assert copy.get_params()["checkpoint_dir"] == str(tmp_path)
    assert copy.get_params()["checkpoint_every"] == 2
    copy.set_params(max_iter=4)
    trainer.set_params(max_iter=4)
    _assert_same_fit(copy.resume(X, y), trainer.resume(X, y))


def test_tampered_checkpoints_are_refused(tmp_path):
    """A checkpoint is data: a bad RNG class name, shapes or values raise ValueError."""
    X, y = _data()
    trainer = _trainer("full", "adam", max_iter=1).fit(X, y)
    trainer.save_checkpoint(tmp_path / "good.npz")
    arrays, meta = read_checkpoint(tmp_path / "good.npz")
    cases = {
        "unknown random bit generator": ({}, {"rng": {**meta["rng"], "bit_generator": "seed"}}),
        "has shape": ({"w0": np.zeros((2, 2), dtype=np.float32)}, {}),
        "NaN or inf": ({"w0": np.full_like(arrays["w0"], np.nan)}, {}),
        "malformed": ({}, {"n_states": []}),
        "negative": ({}, {"n_steps": -1}),
    }
    for match, (new_arrays, new_meta) in cases.items():
        write_checkpoint(tmp_path / "bad.npz", {**arrays, **new_arrays}, {**meta, **new_meta})
        fresh = _trainer("full", "adam", max_iter=1)
        with pytest.raises(ValueError, match=match):
            fresh.load_checkpoint(tmp_path / "bad.npz")
        assert not hasattr(fresh, "n_iter_")  # nothing half-restored


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _rezip(src: Any, dst: Any, **members: bytes) -> None:
    """``src`` with some members (``w0`` for ``w0.npy``...) replaced by raw bytes."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, members.pop(name[:-4], None) or zin.read(name))


def test_broken_checkpoint_files_are_refused_naming_the_file(tmp_path):
    """Truncated, a member without a .npy header, a header declaring 10**12 values, a meta
    nested 200,000 deep: ValueError naming the file (load_checkpoint, checkpoint_info and
    resume alike), before any large allocation."""
    X, y = _data()
    good = tmp_path / "good.npz"
    _trainer("full", "adam", max_iter=1).fit(X, y).save_checkpoint(good)
    huge = io.BytesIO()
    np.lib.format.write_array_header_1_0(huge, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})
    deep = b'{"format": "ort-train-checkpoint", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    members = {
        "no npy header": {"w0": b"not an array"},
        "huge header": {"w0": huge.getvalue() + bytes(64)},
        "deep meta": {"meta": _npy(np.frombuffer(deep, dtype=np.uint8))},
    }
    paths = {}
    for what, replace in members.items():
        paths[what] = tmp_path / what.replace(" ", "_") / CHECKPOINT_FILE
        paths[what].parent.mkdir()
        _rezip(good, paths[what], **replace)
    paths["truncated"] = tmp_path / "truncated" / CHECKPOINT_FILE
    paths["truncated"].parent.mkdir()
    paths["truncated"].write_bytes(good.read_bytes()[:-100])
    for what, path in paths.items():
        tracemalloc.start()
        try:
            with pytest.raises(ValueError, match=re.escape(str(path))):
                _trainer("full", "adam", max_iter=2).load_checkpoint(path)
            with pytest.raises(ValueError, match=re.escape(str(path))):
                checkpoint_info(path)
            with pytest.raises(ValueError, match=re.escape(str(path))):
                _trainer("full", "adam", max_iter=2, checkpoint_dir=path.parent).resume(X, y)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 50 * 2**20, (what, peak)
