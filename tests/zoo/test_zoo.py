"""Issues 17, 26 and 28: the zoo architectures, exported by both torch exporters (GPT-2: TorchScript
only), trained by every route and compared with the same plain-SGD steps in torch. Per-position
labels (segmentation, GPT-2's next tokens) skip the scikit-learn route, whose classifiers take one
label per row.

For each (architecture, exporter, route) and each scope (``all`` weights, or ``head``: the last
Linear only, a frozen backbone), on the same batches in the same order (``shuffle=False``):
- the loss of every step within 1e-4 relative of torch's (the core trainers' losses are means
  over the rows: torch's ``cross_entropy`` for the logits, the squared error summed over the one
  output column and averaged over the rows);
- the BatchNorm running statistics of the trained graph within 1e-5 of torch's;
- the trained graph's outputs (an onnxruntime session) within 1e-5 of torch's ``eval()``.

The reference is torch training the network *as exported* (:func:`zoo_models.as_exported`): the
TorchScript exporter in training mode keeps the network, so that is the network itself; the dynamo
exporter folds BatchNorm into Conv (with the running statistics, as in eval mode) even in training
mode, drops zero biases and merges equal-valued initializers, so torch trains the folded network,
without those biases, with the merged parameters tied. Dropout: every compared network has p=0
(dropout draws different masks in torch and onnxruntime); ``test_trains_with_dropout`` trains a
graph with p>0 and checks only that its loss goes down.

Pairs that fail today are marked ``xfail(strict=True)`` with the item of issue 17 that fixes them;
issue 26's cases that wait for a fix are left out, listed in :data:`PENDING` with the reason.

Both gradient backends (issue 28): the suite runs on the default one (``$ORT_TRAIN_BACKEND``,
``backend_support.BACKEND``). The training build has no CPU kernel for the gradients of
ConvTranspose and Resize: there, training every weight of the UNet is checked to refuse
(:func:`test_training_build_refuses`) and its head to train; the ``onnx`` backend trains it all.
"""

from __future__ import annotations

import copy
import functools
import io
import warnings
from collections.abc import Sequence
from contextlib import redirect_stdout
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onnx  # noqa: E402
import onnxruntime  # noqa: E402
import zoo_models as zm  # noqa: E402
from onnx import numpy_helper  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import ort_train_core  # noqa: E402
from backend_support import BACKEND  # noqa: E402
from ort_train_core import (  # noqa: E402
    Callback,
    LearningRateSGD,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)

N_ROWS = 16
BATCH = 8
EPOCHS = 2  # 4 steps
LR = 0.05
LOSS_RTOL = 1e-4
STATS_ATOL = 1e-5
OUTPUT_ATOL = 1e-5

ROUTES = ("full", "partial", "module", "sklearn")
#: the trainers' warning about what an exporter changed (issue 17, item 8), where it exists
EXPORTED_GRAPH_WARNING = getattr(ort_train_core, "ExportedGraphWarning", None)
SCOPES = ("all", "head")


# --------------------------------------------------------------------------------------------
# shared fixtures: one export per (architecture, exporter) for the whole session


@functools.cache
def _exported(name: str, exporter: str) -> tuple[nn.Module, bytes]:
    p = zm.ALL_CASES[name].export_dropout
    net = zm.build(name, dropout=p)
    inputs, _ = zm.data(name, N_ROWS)
    model = zm.export(net, inputs, exporter)
    if p:  # Dropout nodes exported, then made the identity in both (zoo_models.zero_dropout)
        zm.zero_dropout(net, model)
    return net, model.SerializeToString()


def exported(name: str, exporter: str) -> tuple[nn.Module, onnx.ModelProto]:
    """The network (a copy, in training mode) and its export."""
    net, data = _exported(name, exporter)
    return copy.deepcopy(net), onnx.load_from_string(data)


def training_data(name: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    inputs, y = zm.data(name, N_ROWS)
    if zm.ALL_CASES[name].task == "classification":
        y[: zm.N_CLASSES] = np.arange(zm.N_CLASSES)  # every class present (the sklearn route infers them)
    return inputs, y


def as_fit_input(inputs: dict[str, np.ndarray]) -> Any:
    """One array for a one-input graph, the dict by input name otherwise."""
    return next(iter(inputs.values())) if len(inputs) == 1 else inputs


def batches(batch: int = BATCH, epochs: int = EPOCHS) -> list[slice]:
    """The batches in training order (``shuffle=False``): consecutive slices, every epoch."""
    return [slice(s, s + batch) for _ in range(epochs) for s in range(0, N_ROWS, batch)]


# --------------------------------------------------------------------------------------------
# the torch reference


def torch_loss(task: str, out: Any, y: Any) -> Any:
    """The core trainers' losses: means over the rows of cross-entropy on logits (over every
    position for per-position labels), or of the squared error summed over the output columns."""
    if task != "regression":
        return F.cross_entropy(out, y)
    return ((out - y) ** 2).sum(dim=1).mean()


def torch_steps(
    name: str,
    net: nn.Module,
    inputs: dict[str, np.ndarray],
    y: np.ndarray,
    trained: Sequence[str] | None,
    steps: Sequence[slice],
) -> list[float]:
    """Plain SGD on ``net`` (in place) over :func:`batches`; ``trained``: the torch parameter
    names to train (None: all). Returns the loss of each step."""
    # by every name of a tied parameter (GPT-2's output projection is its token embedding)
    chosen = {
        id(p) for n, p in net.named_parameters(remove_duplicate=False) if trained is None or n in trained
    }
    params = [p for p in net.parameters() if id(p) in chosen]
    for p in net.parameters():
        p.requires_grad_(id(p) in chosen)
    opt = torch.optim.SGD(params, lr=LR)
    tensors = [torch.from_numpy(v) for v in inputs.values()]
    target = torch.from_numpy(y)
    losses = []
    net.train()
    for batch in steps:
        opt.zero_grad()
        loss = torch_loss(zm.ALL_CASES[name].task, net(*[t[batch] for t in tensors]), target[batch])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def torch_eval(net: nn.Module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    net.eval()
    with torch.no_grad():
        out = net(*[torch.from_numpy(v) for v in inputs.values()]).numpy()
    return np.asarray(out)


# --------------------------------------------------------------------------------------------
# the routes: each returns (the loss of each step, the trained prediction graph)


class StepLosses(Callback):
    """Records each step's loss."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_batch_end(self, trainer: Any, epoch: int, batch: int, loss: float) -> None:
        self.losses.append(float(loss))


def _core_options(weights: list[str] | None, record: StepLosses, epochs: int) -> dict[str, Any]:
    return dict(
        weights_to_train=weights,
        max_iter=epochs,
        batch_size=BATCH,
        learning_rate=LearningRateSGD(eta0=LR, learning_rate="constant"),
        shuffle=False,
        callbacks=[record],
    )


def run_full(
    name: str, model: onnx.ModelProto, weights: list[str] | None, epochs: int = EPOCHS
) -> tuple[list[float], onnx.ModelProto]:
    inputs, y = training_data(name)
    score = "squared_error" if zm.ALL_CASES[name].task == "regression" else "cross_entropy"
    record = StepLosses()
    trainer = OrtGradientOptimizer(
        add_loss_output(model, score_name=score), **_core_options(weights, record, epochs)
    )
    trainer.fit(as_fit_input(inputs), y)
    return record.losses, trainer.get_trained_onnx()


def run_partial(
    name: str, model: onnx.ModelProto, weights: list[str] | None, epochs: int = EPOCHS
) -> tuple[list[float], onnx.ModelProto]:
    inputs, y = training_data(name)
    loss = "square_error" if zm.ALL_CASES[name].task == "regression" else "cross_entropy"
    record = StepLosses()
    trainer = OrtGradientForwardBackwardOptimizer(
        model, learning_loss=loss, **_core_options(weights, record, epochs)
    )
    trainer.fit(as_fit_input(inputs), y)
    return record.losses, trainer.get_trained_onnx()


def run_module(
    name: str, model: onnx.ModelProto, weights: list[str] | None, epochs: int = EPOCHS
) -> tuple[list[float], onnx.ModelProto]:
    """OnnxModule trained by torch's SGD, the loss computed by torch."""
    from ort_train_torch import OnnxModule

    inputs, y = training_data(name)
    module = OnnxModule(model, weights_to_train=weights)
    losses = torch_steps(name, module, inputs, y, None, batches(epochs=epochs))
    return losses, module.to_onnx()


def run_sklearn(
    name: str, model: onnx.ModelProto, weights: list[str] | None, epochs: int = EPOCHS
) -> tuple[list[float], onnx.ModelProto]:
    """OnnxModelClassifier / OnnxModelRegressor: scikit-learn reports the loss per epoch
    (``loss_curve_``), so each epoch is one batch here (the same steps as torch's with
    ``batch_size=N_ROWS``, see :func:`test_trains_like_torch`)."""
    from ort_train_sklearn import OnnxModelClassifier, OnnxModelRegressor

    inputs, y = training_data(name)
    classifier = zm.ALL_CASES[name].task == "classification"
    estimator = (OnnxModelClassifier if classifier else OnnxModelRegressor)(
        model,
        weights_to_train=weights,
        solver="sgd",
        learning_rate_init=LR,
        momentum=0.0,
        batch_size=N_ROWS,
        max_iter=len(batches(epochs=epochs)),
        shuffle=False,
    )
    with warnings.catch_warnings():
        # a few epochs do not converge: the ConvergenceWarning is expected
        warnings.simplefilter("ignore", category=ConvergenceWarning)
        warnings.simplefilter("ignore", category=ort_train_core.ConvergenceWarning)
        estimator.fit(as_fit_input(inputs), y if classifier else y.ravel())
    # the trainers' objective: OnnxModelRegressor reports squared_error on MLPRegressor's
    # scale (half the mean over rows and outputs; one output here), OnnxModelClassifier as it is
    scale = 1.0 if classifier else 2.0
    return [scale * v for v in estimator.loss_curve_], estimator.to_onnx()


RUNNERS = {"full": run_full, "partial": run_partial, "module": run_module, "sklearn": run_sklearn}


# --------------------------------------------------------------------------------------------
# what fails today (issue 17)


def known_failures(name: str, exporter: str, route: str, scope: str) -> list[str]:
    """Why a pair fails today, by item of issue 17 (empty when it should pass)."""
    return []


def _xfail(reasons: list[str]) -> list[Any]:
    """A strict xfail naming the items of issue 17 (flips to a failure once they are fixed)."""
    return [pytest.mark.xfail(strict=True, reason="issue 17 " + "; ".join(reasons))] if reasons else []


#: issue 26: the tests that do not pass yet, by test and pytest id, with what they wait for. They
#: are left out of the suite (not xfailed) until the fix lands: delete an entry to run its test.
PENDING: dict[str, str] = {}


def routes(name: str) -> tuple[str, ...]:
    """The routes of an architecture: scikit-learn's classifiers take one label per row, so
    per-position labels (segmentation, language models) skip the scikit-learn route."""
    return tuple(r for r in ROUTES if r != "sklearn" or zm.ALL_CASES[name].task != "per_position")


def refused_here(name: str, scope: str) -> bool:
    """Whether this run's backend refuses to train the pair: the training build cannot run the
    gradient of some operators on every weight's path (:attr:`zoo_models.ZooCase.training_build_refuses`;
    the head alone trains there)."""
    refuses = zm.ALL_CASES[name].training_build_refuses
    return bool(refuses) and scope == "all" and BACKEND == "onnxruntime-training"


def _cases(refused: bool = False) -> list[Any]:
    """The (architecture, exporter, route, scope) pairs this backend trains, or with
    ``refused=True`` those it refuses."""
    out = []
    for name, case in zm.ALL_CASES.items():
        for exporter in case.exporters:
            for route in routes(name):
                for scope in SCOPES:
                    if refused_here(name, scope) != refused:
                        continue
                    reasons = known_failures(name, exporter, route, scope)
                    case_id = f"{name}-{exporter}-{route}-{scope}"
                    if f"trains_like_torch[{case_id}]" in PENDING:
                        continue
                    out.append(pytest.param(name, exporter, route, scope, marks=_xfail(reasons), id=case_id))
    return out


# --------------------------------------------------------------------------------------------
# tests


def _session_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The graph's prediction in an onnxruntime session: its first output, or the
    'probabilities' of a deployed classifier (OnnxModelClassifier.to_onnx: label, probabilities)."""
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    outputs = [o.name for o in sess.get_outputs()]
    wanted = "probabilities" if "probabilities" in outputs else outputs[0]
    # by name, or by position: the scikit-learn route's to_onnx() names its single input 'X'
    feeds = {k: inputs[k] for k in names} if set(names) <= set(inputs) else dict(zip(names, inputs.values()))
    return np.asarray(sess.run([wanted], feeds)[0])


def _expected_outputs(
    trained: onnx.ModelProto, reference: nn.Module, inputs: dict[str, np.ndarray]
) -> np.ndarray:
    """torch's eval() outputs, as softmax probabilities where the graph deploys them."""
    out = torch_eval(reference, inputs)
    if "probabilities" in [o.name for o in trained.graph.output]:
        return np.asarray(torch.softmax(torch.from_numpy(out), dim=1).numpy())
    return out


def _check_running_statistics(trained: onnx.ModelProto, reference: nn.Module) -> None:
    values = {t.name: numpy_helper.to_array(t) for t in trained.graph.initializer}
    stats = {
        n: b.numpy() for n, b in reference.named_buffers() if n.endswith(("running_mean", "running_var"))
    }
    for tname, expected in stats.items():
        assert tname in values, f"the trained graph lost the running statistic {tname!r}"
        np.testing.assert_allclose(values[tname], expected, rtol=0, atol=STATS_ATOL, err_msg=tname)


def expects_export_warning(name: str, exporter: str) -> bool:
    """Whether the trainers' ExportedGraphWarning is expected: on every dynamo export (what that
    exporter changed, issue 17 item 8), and on issue 26's and 28's networks whatever the
    exporter: they hold what the warning names on purpose (GPT-2's tied embedding, the MLP's
    shared layer) or Conv without BatchNorm (GroupNorm, TCN, segmentation, UNet: nothing was
    folded)."""
    return exporter == "dynamo" or name in zm.ZOO_ROUND2 or name in zm.ZOO_ROUND3


@pytest.mark.parametrize(("name", "exporter", "route", "scope"), _cases())
def test_trains_like_torch(name: str, exporter: str, route: str, scope: str) -> None:
    net, model = exported(name, exporter)
    reference = zm.as_exported(net, model)  # the network as exported (the module's docstring)
    weights = zm.head_initializers(name, net, model) if scope == "head" else None
    head = zm.ALL_CASES[name].head
    trained_names = None if scope == "all" else [f"{head}.weight", f"{head}.bias"]

    with warnings.catch_warnings():
        if expects_export_warning(name, exporter) and EXPORTED_GRAPH_WARNING is not None:
            warnings.simplefilter("ignore", category=EXPORTED_GRAPH_WARNING)
        losses, trained = RUNNERS[route](name, model, weights)

    inputs, y = training_data(name)
    # one batch per epoch on the scikit-learn route (see run_sklearn)
    steps = batches(N_ROWS, len(batches())) if route == "sklearn" else batches()
    expected = torch_steps(name, reference, inputs, y, trained_names, steps)
    np.testing.assert_allclose(losses, expected, rtol=LOSS_RTOL, err_msg="loss per step")
    _check_running_statistics(trained, reference)
    np.testing.assert_allclose(
        _session_outputs(trained, inputs),
        _expected_outputs(trained, reference, inputs),
        rtol=OUTPUT_ATOL,
        atol=OUTPUT_ATOL,
    )


# (an empty set on the onnx backend, which trains every case: pytest reports it skipped)
@pytest.mark.parametrize(("name", "exporter", "route", "scope"), _cases(refused=True))
def test_training_build_refuses(name: str, exporter: str, route: str, scope: str) -> None:
    """The training build has no CPU kernel for ConvTransposeGrad nor ResizeGrad: training every
    weight of the UNet refuses on every route, naming the operator and the node, before any step
    (the onnx backend trains it: :func:`test_trains_like_torch`)."""
    _, model = exported(name, exporter)
    operators = "|".join(zm.ALL_CASES[name].training_build_refuses)
    with warnings.catch_warnings():
        if EXPORTED_GRAPH_WARNING is not None:
            warnings.simplefilter("ignore", category=EXPORTED_GRAPH_WARNING)
        with pytest.raises(
            ort_train_core.GraphNotDifferentiableError,
            match=rf"^operator ({operators}) \(node '[^']+'\) has no gradient kernel on CPU in "
            r"onnxruntime-training 1\.19\.2 \(\1Grad exists only for CUDA\): train on a CUDA device, "
            r"leave the weights before the \1 out of weights_to_train",
        ):
            RUNNERS[route](name, model, None)


def _inspect_cases() -> list[Any]:
    out = []
    for name, case in zm.ALL_CASES.items():
        for exporter in case.exporters:
            if f"inspect_reports_trainable[{name}-{exporter}]" in PENDING:
                continue
            out.append(pytest.param(name, exporter, id=f"{name}-{exporter}"))
    return out


@pytest.mark.parametrize(("name", "exporter"), _inspect_cases())
def test_inspect_reports_trainable(name: str, exporter: str, tmp_path: Any) -> None:
    from ort_train_core.cli import main

    _, model = exported(name, exporter)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    out = io.StringIO()
    with redirect_stdout(out):
        main(["inspect", str(path)])
    assert "gradient graph: yes" in out.getvalue(), out.getvalue()


#: the networks trained with real dropout (p=0.5): the zoo's Conv1d net exported by TorchScript,
#: and the shared-layer MLP exported by dynamo (one-output Dropout nodes, issue 26 item 15)
DROPOUT_NETWORKS = (("conv1d", "torchscript"), ("dropout_mlp", "dynamo"))
#: (epochs, steps averaged at each end) per network: the MLP's three Dropout(0.5) layers on random
#: labels make its step losses noisy (0.96 to 1.25), and its masks depend on what the process ran
#: before; 40 epochs put the decrease (0.29) several noise widths apart
TREND_STEPS = {"conv1d": (20, 3), "dropout_mlp": (40, 5)}


def _dropout_cases() -> list[Any]:
    out = []
    for name, exporter in DROPOUT_NETWORKS:
        for route in ROUTES:
            if f"trains_with_dropout[{name}-{exporter}-{route}]" in PENDING:
                continue
            # the running statistics (item 3) are not checked here
            reasons = [r for r in known_failures(name, exporter, route, "all") if not r.startswith("item 3")]
            out.append(
                pytest.param(name, exporter, route, marks=_xfail(reasons), id=f"{name}-{exporter}-{route}")
            )
    return out


@pytest.mark.parametrize(("name", "exporter", "route"), _dropout_cases())
def test_trains_with_dropout(name: str, exporter: str, route: str) -> None:
    """Dropout(p=0.5) exported in training mode: dropout is random in training, so only the
    trend is checked: finite losses, the last ones lower; the deployed graph predicts without
    dropout (the same outputs on two runs)."""
    net = zm.build(name, dropout=0.5)
    inputs, _ = training_data(name)
    model = zm.export(net, inputs, exporter)
    assert any(node.op_type == "Dropout" for node in model.graph.node)
    with warnings.catch_warnings():
        if expects_export_warning(name, exporter) and EXPORTED_GRAPH_WARNING is not None:
            warnings.simplefilter("ignore", category=EXPORTED_GRAPH_WARNING)
        epochs, k = TREND_STEPS[name]
        losses, trained = RUNNERS[route](name, model, None, epochs)
    assert np.isfinite(losses).all()
    assert np.mean(losses[-k:]) < np.mean(losses[:k]), losses
    first = _session_outputs(trained, inputs)
    assert np.isfinite(first).all()
    np.testing.assert_array_equal(_session_outputs(trained, inputs), first)


def test_gpt2_torchscript_keeps_the_tie() -> None:
    """GPT-2's output projection is its token embedding (one tensor in torch); the TorchScript
    export with ``do_constant_folding=False`` keeps it one initializer, read by the embedding's
    Gather and by the output projection, so every route trains the two uses as one (the dynamo
    exporter writes a transposed copy instead: issue 26, item 2)."""
    net, model = exported("gpt2", "torchscript")
    assert net.gpt.lm_head.weight is net.gpt.transformer.wte.weight
    shared = zm.parameter_map(net, model).shared()
    assert shared == {"gpt.transformer.wte.weight": ["gpt.transformer.wte.weight", "gpt.lm_head.weight"]}
    readers = [n.op_type for n in model.graph.node if "gpt.transformer.wte.weight" in n.input]
    assert sorted(readers) == ["Gather", "Transpose"], readers


#: issue 28: the operators each new family is in the zoo for, in the graphs of both exporters
FAMILY_OPERATORS = {
    "unet": {"MaxPool", "ConvTranspose", "Resize", "Concat", "Conv"},
    # GroupNorm: InstanceNormalization over the groups; SiLU: Sigmoid and Mul; SE: HardSigmoid
    "norm_silu_cnn": {"InstanceNormalization", "Sigmoid", "HardSigmoid", "Conv", "Gemm"},
    "recommender": {"Gather", "Concat", "Gemm"},
}


@pytest.mark.parametrize("exporter", zm.EXPORTERS)
@pytest.mark.parametrize("name", list(FAMILY_OPERATORS))
def test_family_holds_its_operators(name: str, exporter: str) -> None:
    """Each issue-28 family's export holds the operators it stands for; the recommender's graph
    takes two inputs, float features and int64 ids; the CNN normalises with GroupNorm and with
    InstanceNorm (two InstanceNormalization nodes, one with the torch InstanceNorm's own scale)."""
    _, model = exported(name, exporter)
    ops = {node.op_type for node in model.graph.node}
    assert FAMILY_OPERATORS[name] <= ops, sorted(ops)
    if name == "recommender":
        types = [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input]
        assert types == [("X", onnx.TensorProto.FLOAT), ("ids", onnx.TensorProto.INT64)]
    if name == "norm_silu_cnn":
        scales = [n.input[1] for n in model.graph.node if n.op_type == "InstanceNormalization"]
        assert len(scales) == 2
        assert "inorm.weight" in scales, scales
