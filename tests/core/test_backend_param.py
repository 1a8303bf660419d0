"""``backend=`` on every core entry point (issue 27, items 3, 4 and 7): the full loop, the partial
loop, OrtGradientForwardBackward, onnx_derivative and ``ort-train --backend``. Each trains (or
differentiates) with the backend it names, against the numpy math contract
(tests/core/reference.py); where the training build is loaded, both backends give the same weights
after the same 20 steps within 1e-5. The training build's cases skip on stock onnxruntime."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
import reference as ref
from core_models import build_mlp, initializers
from onnx import numpy_helper

import ort_train_core as otc
from backend_support import BOTH, needs_training
from ort_train_core.cli import gradient_status, main
from ort_train_core.graph import set_batch_dimension

N_ROWS, N_FEATURES, N_HIDDEN, N_OUT = 20, 4, 5, 2
BATCH, EPOCHS = 4, 4  # 5 steps an epoch: 20 steps
AGREE = 1e-5  # the two backends after the same 20 steps
RTOL, ATOL = 1e-4, 1e-6  # float32 against numpy's float64
L1, L2 = 0.01, 0.05
#: the penalised weights (rank >= 2: the partial loop's ElasticLearningPenalty takes those)
PENALTY = {"W1": (L1, L2), "W2": (L1, L2)}
UNKNOWN = r"unknown gradient backend 'autodiff'.*'onnx', 'onnxruntime-training'"

# name -> (the numpy reference's optimizer, the package's learning rate)
OPTIMIZERS: dict[str, tuple[Callable[[], ref.Optimizer], Callable[[], otc.BaseLearningRate]]] = {
    "sgd": (
        lambda: ref.Optimizer("sgd", 0.05, "invscaling", power_t=0.5),
        lambda: otc.LearningRateSGD(eta0=0.05, power_t=0.5, learning_rate="invscaling"),
    ),
    "nesterov": (
        lambda: ref.Optimizer("nesterov", 0.02, "invscaling", power_t=0.3, momentum=0.7),
        lambda: otc.LearningRateSGDNesterov(eta0=0.02, power_t=0.3, momentum=0.7, nesterov=True),
    ),
    "adam": (
        lambda: ref.Optimizer("adam", 0.02, beta1=0.8, beta2=0.99, epsilon=1e-7),
        lambda: otc.LearningRateAdam(eta0=0.02, beta1=0.8, beta2=0.99, epsilon=1e-7),
    ),
}


def _model(n_out: int = N_OUT) -> onnx.ModelProto:
    return build_mlp(N_FEATURES, N_HIDDEN, n_out, seed=3)


def _data(n_out: int = N_OUT) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    X = rng.standard_normal((N_ROWS, N_FEATURES)).astype(np.float32)
    y = X @ rng.standard_normal((N_FEATURES, n_out)) + 0.5 + 0.3 * rng.standard_normal((N_ROWS, n_out))
    return X, y.astype(np.float32), rng.uniform(0.2, 2.0, N_ROWS).astype(np.float32)


def _numpy_fit(opt: str) -> dict[str, np.ndarray]:
    X, y, sw = _data()
    problem = ref.Problem("mlp", "identity", ref.Score("squared_error"), PENALTY)
    weights, _ = ref.train(problem, OPTIMIZERS[opt][0](), initializers(_model()), X, y, sw, EPOCHS, BATCH)
    return weights


def _full(opt: str, backend: str | None) -> otc.OrtGradientOptimizer:
    penalty = {w: {"l1": l1, "l2": l2} for w, (l1, l2) in PENALTY.items()}
    model = otc.add_loss_output(_model(), weight_name="weight", penalty=penalty)
    trainer = otc.OrtGradientOptimizer(
        model,
        max_iter=EPOCHS,
        batch_size=BATCH,
        learning_rate=OPTIMIZERS[opt][1](),
        shuffle=False,
        backend=backend,
    )
    return trainer.fit(*_data())


def _partial(opt: str, backend: str | None) -> otc.OrtGradientForwardBackwardOptimizer:
    trainer = otc.OrtGradientForwardBackwardOptimizer(
        _model(),
        max_iter=EPOCHS,
        batch_size=BATCH,
        learning_rate=OPTIMIZERS[opt][1](),
        learning_penalty=otc.ElasticLearningPenalty(l1=L1, l2=L2),
        shuffle=False,
        backend=backend,
    )
    return trainer.fit(*_data())


def _assert_close(
    got: dict[str, np.ndarray], expected: dict[str, np.ndarray], rtol: float, atol: float
) -> None:
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=rtol, atol=atol, err_msg=name)


def _training_build_nodes(models: dict[str, Any]) -> list[str]:
    """The nodes of graphs (save_onnx_graph's dict of bytes, or models) that only the training
    build's backend writes: com.microsoft operators (its gradient ops, YieldOp), and the nodes
    its gradient builder names ``<forward node>_Grad/<op>_<k>`` (the rewrites that let stock
    kernels run its gradients keep those names)."""
    found = []
    for name, data in models.items():
        model = onnx.load_from_string(data) if isinstance(data, bytes) else data
        found += [
            f"{name}:{n.op_type}:{n.name}"
            for n in model.graph.node
            if n.domain == "com.microsoft" or "_Grad/" in n.name
        ]
    return found


# ---- the loops against numpy, and the two backends against each other -------------------------
@pytest.mark.parametrize("opt", ["sgd", "nesterov", "adam"])
@pytest.mark.parametrize("backend", BOTH)
def test_full_loop_meets_the_math_contract(backend: str, opt: str) -> None:
    trainer = _full(opt, backend)
    moved = max(np.abs(trainer.get_state()[w] - initializers(_model())[w]).max() for w in PENALTY)
    assert moved > 1e-2  # not two unchanged copies
    _assert_close(trainer.get_state(), _numpy_fit(opt), RTOL, ATOL)


@needs_training
@pytest.mark.parametrize("opt", ["sgd", "nesterov", "adam"])
def test_full_loop_backends_agree_after_20_steps(opt: str) -> None:
    ours, theirs = _full(opt, "onnx"), _full(opt, "onnxruntime-training")
    _assert_close(ours.get_state(), theirs.get_state(), AGREE, AGREE)
    np.testing.assert_allclose(ours.train_losses_, theirs.train_losses_, rtol=AGREE)


@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize("backend", BOTH)
def test_partial_loop_meets_the_math_contract(backend: str, opt: str) -> None:
    _assert_close(_partial(opt, backend).get_state(), _numpy_fit(opt), RTOL, ATOL)


@needs_training
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_partial_loop_backends_agree_after_20_steps(opt: str) -> None:
    ours, theirs = _partial(opt, "onnx"), _partial(opt, "onnxruntime-training")
    _assert_close(ours.get_state(), theirs.get_state(), AGREE, AGREE)
    np.testing.assert_allclose(ours.train_losses_, theirs.train_losses_, rtol=AGREE)


# ---- the backend named is the one used ----------------------------------------------------------
@pytest.mark.parametrize("loop", [_full, _partial])
def test_backend_onnx_writes_no_training_build_node(loop: Callable[..., Any]) -> None:
    graphs = loop("sgd", "onnx").save_onnx_graph({})
    assert len(graphs) >= 3  # trained, loss, the step graphs
    assert _training_build_nodes(graphs) == []


@needs_training
def test_switching_backend_never_reuses_the_other_backends_graphs() -> None:
    """The trainer's record of step graphs and the process caches are keyed by backend: a set
    backend (set_params, or assigned) and a new trainer over the same graph build their own."""
    trainer = _full("sgd", "onnxruntime-training")
    assert _training_build_nodes(trainer.save_onnx_graph({}))  # the training build's gradient ops
    trainer.backend = "onnx"  # assigned, not through set_params
    trainer.fit(*_data())
    assert _training_build_nodes(trainer.save_onnx_graph({})) == []
    trainer.set_params(backend="onnxruntime-training")
    trainer.fit(*_data())
    assert _training_build_nodes(trainer.save_onnx_graph({}))
    # a new trainer over the same graph and settings: the process caches hold both backends'
    assert _training_build_nodes(_full("sgd", "onnx").save_onnx_graph({})) == []
    assert _training_build_nodes(_partial("sgd", "onnxruntime-training").save_onnx_graph({}))
    assert _training_build_nodes(_partial("sgd", "onnx").save_onnx_graph({})) == []


# ---- OrtGradientForwardBackward and onnx_derivative ---------------------------------------------
def _pair_gradients(backend: str | None) -> tuple[otc.OrtGradientForwardBackward, dict[str, np.ndarray]]:
    X, y, _ = _data()
    fb = otc.OrtGradientForwardBackward(_model(), backend=backend)
    fb.forward([X])
    grads = fb.backward([np.ascontiguousarray(y)])  # any output gradient: y
    return fb, {w: np.asarray(g.numpy()) for w, g in zip(fb.weights_to_train, grads)}


@pytest.mark.parametrize("backend", BOTH)
def test_forward_backward_gradients_equal_numpys(backend: str) -> None:
    X, y, _ = _data()
    params = {k: v.astype(np.float64) for k, v in initializers(_model()).items()}
    _, cache = ref.forward("mlp", params, X.astype(np.float64))
    fb, got = _pair_gradients(backend)
    _assert_close(got, ref.backward("mlp", params, cache, y.astype(np.float64)), RTOL, ATOL)
    assert fb.backend == backend
    if backend == "onnx":
        assert _training_build_nodes({"pair": fb.graphs.gradient_model}) == []


@needs_training
def test_forward_backward_backends_agree() -> None:
    _assert_close(_pair_gradients("onnx")[1], _pair_gradients("onnxruntime-training")[1], AGREE, AGREE)


def test_forward_backward_pickle_keeps_the_backend() -> None:
    fb, expected = _pair_gradients("onnx")
    copy = pickle.loads(pickle.dumps(fb))
    assert copy.backend == "onnx"
    assert _training_build_nodes({"pair": copy.graphs.gradient_model}) == []
    X, y, _ = _data()
    copy.forward([X])
    got = copy.backward([np.ascontiguousarray(y)])
    _assert_close({w: np.asarray(g.numpy()) for w, g in zip(copy.weights_to_train, got)}, expected, 0, 0)


@pytest.mark.parametrize("backend", BOTH)
def test_onnx_derivative_of_a_loss_equals_numpys_gradient(backend: str) -> None:
    penalty = {w: {"l1": l1, "l2": l2} for w, (l1, l2) in PENALTY.items()}
    loss_model = otc.add_loss_output(_model(), weight_name="weight", penalty=penalty)
    # the onnx backend differentiates static shapes: the batch fixed, as the trainers do
    loss_model = set_batch_dimension(loss_model, ["X", "label", "weight"], N_ROWS)
    names = ["W1", "b1", "W2", "b2"]
    grad = otc.onnx_derivative(
        loss_model, weights=names, inputs=[], options=otc.DerivativeOptions.Loss, loss="loss",
        label=["label", "weight"], backend=backend,
    )  # fmt: skip
    X, y, sw = _data()
    start = initializers(_model())
    sess = onnxruntime.InferenceSession(grad.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = sess.run([f"{w}_grad" for w in names], {"X": X, "label": y, "weight": sw, **start})
    problem = ref.Problem("mlp", "identity", ref.Score("squared_error"), PENALTY)
    params = {k: v.astype(np.float64) for k, v in start.items()}
    _, expected = problem.objective(params, X.astype(np.float64), y.astype(np.float64), sw.astype(np.float64))
    _assert_close(dict(zip(names, outputs)), expected, RTOL, ATOL)
    assert bool(_training_build_nodes({"grad": grad})) == (backend == "onnxruntime-training")


# ---- the parameter's protocol and its refusal ---------------------------------------------------
def test_unknown_backend_is_refused_naming_the_choices() -> None:
    X, y, sw = _data()
    model = otc.add_loss_output(_model(), weight_name="weight")
    for trainer in (
        otc.OrtGradientOptimizer(model, backend="autodiff"),
        otc.OrtGradientForwardBackwardOptimizer(_model(), backend="autodiff"),
    ):
        with pytest.raises(ValueError, match=UNKNOWN):
            trainer.fit(X, y, sw)
        assert not hasattr(trainer, "n_iter_")
    with pytest.raises(ValueError, match=UNKNOWN):
        otc.OrtGradientForwardBackward(_model(), backend="autodiff")
    with pytest.raises(ValueError, match=UNKNOWN):
        otc.onnx_derivative(_model(), backend="autodiff")
    with pytest.raises(ValueError, match=UNKNOWN):
        gradient_status(_model(), backend="autodiff")


@pytest.mark.parametrize("cls", [otc.OrtGradientOptimizer, otc.OrtGradientForwardBackwardOptimizer])
def test_backend_is_a_parameter_kept_by_clone_and_pickle(cls: type) -> None:
    trainer = cls(_model())
    assert trainer.get_params()["backend"] is None
    assert trainer.set_params(backend="onnx") is trainer
    assert trainer.clone().backend == "onnx"
    assert "backend='onnx'" in repr(trainer)
    assert pickle.loads(pickle.dumps(trainer)).get_params()["backend"] == "onnx"
    state = trainer.__getstate__()
    del state["backend"]  # pickled before the setting existed: the default
    old = cls.__new__(cls)
    old.__setstate__(state)
    assert old.get_params()["backend"] is None


# ---- checkpoints: exact resume on each backend, and across them ---------------------------------
def _checkpointed(loop: str, backend: str, epochs: int, folder: Path | None = None) -> Any:
    common: dict[str, Any] = dict(
        max_iter=epochs, batch_size=BATCH, learning_rate=OPTIMIZERS["adam"][1](), random_state=11,
        checkpoint_dir=folder, backend=backend,
    )  # fmt: skip
    if loop == "full":
        return otc.OrtGradientOptimizer(otc.add_loss_output(_model(), weight_name="weight"), **common)
    return otc.OrtGradientForwardBackwardOptimizer(_model(), **common)


@pytest.mark.parametrize("loop", ["full", "partial"])
@pytest.mark.parametrize("backend", BOTH)
def test_resume_on_each_backend_equals_the_uninterrupted_fit(tmp_path: Path, backend: str, loop: str) -> None:
    X, y, sw = _data()
    straight = _checkpointed(loop, backend, EPOCHS).fit(X, y, sw)
    _checkpointed(loop, backend, 2, tmp_path).fit(X, y, sw)
    resumed = _checkpointed(loop, backend, EPOCHS, tmp_path)
    resumed.resume(X, y, sw)
    assert resumed.n_iter_ == EPOCHS
    _assert_close(resumed.get_state(), straight.get_state(), 0, 1e-6)


@needs_training
@pytest.mark.parametrize("loop", ["full", "partial"])
def test_a_checkpoint_resumes_on_the_other_backend(tmp_path: Path, loop: str) -> None:
    """The checkpoint holds weights, optimizer state and progress, not graphs: one written by
    the training build's backend resumes on ours, where the uninterrupted fit ends (1e-5)."""
    X, y, sw = _data()
    straight = _checkpointed(loop, "onnxruntime-training", EPOCHS).fit(X, y, sw)
    _checkpointed(loop, "onnxruntime-training", 2, tmp_path).fit(X, y, sw)
    resumed = _checkpointed(loop, "onnx", EPOCHS, tmp_path)
    resumed.resume(X, y, sw)
    _assert_close(resumed.get_state(), straight.get_state(), AGREE, AGREE)
    assert _training_build_nodes(resumed.save_onnx_graph({})) == []


# ---- the command line -------------------------------------------------------------------------
def _cli_fit(tmp_path: Path, backend: str) -> dict[str, np.ndarray]:
    X, y, _ = _data(1)
    onnx.save(_model(1), str(tmp_path / "mlp.onnx"))
    np.savez(tmp_path / "data.npz", X=X, y=y[:, 0])
    out = tmp_path / f"trained_{backend}.onnx"
    options = f"--target y --epochs {EPOCHS} --batch-size {BATCH} --lr 0.05 --no-shuffle --quiet"
    argv = ["fit", tmp_path / "mlp.onnx", "--data", tmp_path / "data.npz", *options.split()]
    assert main([str(a) for a in [*argv, "--backend", backend, "--out", out]]) == 0
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer}


@pytest.mark.parametrize("backend", BOTH)
def test_cli_backend_writes_the_apis_model(
    tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _cli_fit(tmp_path, backend)
    X, y, _ = _data(1)
    lr = otc.LearningRateSGD(eta0=0.05, learning_rate="constant")
    api = otc.OrtGradientOptimizer(
        otc.add_loss_output(_model(1)), max_iter=EPOCHS, batch_size=BATCH, learning_rate=lr, shuffle=False,
        random_state=0, backend=backend,
    ).fit(X, y)  # fmt: skip
    _assert_close(got, api.get_state(), 1e-7, 0)
    problem = ref.Problem("mlp", "identity", ref.Score("squared_error"))
    expected, _ = ref.train(
        problem, ref.Optimizer("sgd", 0.05), initializers(_model(1)), X, y, None, EPOCHS, BATCH
    )
    _assert_close(got, expected, RTOL, ATOL)
    capsys.readouterr()


@needs_training
def test_cli_backends_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _assert_close(_cli_fit(tmp_path, "onnx"), _cli_fit(tmp_path, "onnxruntime-training"), AGREE, AGREE)
    capsys.readouterr()


def test_cli_refuses_an_unknown_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    onnx.save(_model(1), str(tmp_path / "mlp.onnx"))
    assert main(["inspect", str(tmp_path / "mlp.onnx"), "--backend", "autodiff"]) == 2
    assert "invalid choice: 'autodiff'" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "mlp.onnx"), "--backend", "onnx"]) == 0
    assert "gradient graph: yes" in capsys.readouterr().out
