"""What the torch exporters leave in a graph (issue 17, item 8), reproduced with real exports of
both exporters (``dynamo=False``: TorchScript, ``dynamo=True``):

- the dynamo exporter leaves 0-d float constants among the initializers (the attention mask's
  fill value, ``-inf``, read by Where; the attention scale): they are not default weights, and
  a transformer-like graph with them trains as torch does;
- exporters merge equal-valued parameters (two LayerNorm gammas into one tensor, tied through
  Identity nodes or read by several nodes): fit and ``inspect`` warn, naming them, with the
  export settings that avoid it; an ExportedGraphWarning a user can filter;
- an eval-mode export (and dynamo's, even in training mode) folds BatchNorm into Conv: fit and
  ``inspect`` say it may have happened.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")
nn = torch.nn

from ort_train_core import (  # noqa: E402
    ExportedGraphWarning,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core.cli import main  # noqa: E402
from ort_train_core.graph import MAX_IR_VERSION, default_weights_to_train  # noqa: E402

T, F, N_CLASSES = 6, 8, 3
LR = 0.1


class Attention(nn.Module):
    """One self-attention block on a 2-D float input (T tokens of F features; a token whose first
    feature is 0 is padding, masked with ``-inf``), two LayerNorms, a classifier head."""

    def __init__(self, distinct_norms: bool) -> None:
        super().__init__()
        self.q, self.k, self.v, self.ff = (nn.Linear(F, F) for _ in range(4))
        self.norm1, self.norm2 = nn.LayerNorm(F), nn.LayerNorm(F)
        self.head = nn.Linear(F, N_CLASSES)
        if distinct_norms:  # values no exporter merges
            with torch.no_grad():
                for p in (*self.norm1.parameters(), *self.norm2.parameters()):
                    p.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], T, F)
        pad = h[..., 0] == 0
        scores = self.q(h) @ self.k(h).transpose(1, 2) / F**0.5
        scores = scores.masked_fill(pad[:, None, :], float("-inf"))
        h = self.norm1(h + torch.softmax(scores, -1) @ self.v(h))
        h = self.norm2(h + torch.relu(self.ff(h)))
        return self.head(h.mean(1))


class SmallCNN(nn.Module):
    """Conv -> BatchNorm -> ReLU, twice, global average pooling, a linear head; X is [N, 3*8*8]."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.c2, self.b2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.head = nn.Linear(4, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], 3, 8, 8)
        h = torch.relu(self.b1(self.c1(h)))
        h = torch.relu(self.b2(self.c2(h)))
        return self.head(h.mean((2, 3)))


def _export(net: nn.Module, n_features: int, exporter: str, training: bool) -> onnx.ModelProto:
    """``exporter``: 'dynamo', or 'torchscript' (eval mode with constant folding, the default,
    or training mode without it: the settings that keep parameters one-to-one)."""
    example = (torch.randn(4, n_features),)
    buffer = io.BytesIO()
    net.train(training)
    kwargs: dict = dict(opset_version=18, input_names=["X"], output_names=["logits"])
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")  # torch's dynamo exporter writes through onnxscript
        kwargs.update(dynamo=True, dynamic_shapes=({0: torch.export.Dim("N")},))
    else:
        mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
        kwargs.update(
            dynamo=False,
            dynamic_axes={"X": {0: "N"}, "logits": {0: "N"}},
            training=mode,
            do_constant_folding=not training,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, example, buffer, verbose=False, **kwargs)
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


def _data(n: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, T * F)).astype(np.float32)
    X[: n // 2, -F:] = 0  # the last token of half the rows is padding
    return X, (np.arange(n) % N_CLASSES).astype(np.int64)


def _torch_losses(net: nn.Module, X: np.ndarray, y: np.ndarray, steps: int) -> list[float]:
    """The loss before each full-batch SGD step of torch."""
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(torch.from_numpy(X)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _scalars(model: onnx.ModelProto) -> dict[str, list[str]]:
    """The 0-d float initializers and the operators reading them."""
    out: dict[str, list[str]] = {}
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT and not init.dims:
            out[init.name] = [n.op_type for n in model.graph.node if init.name in n.input]
    return out


def _fit(trainer, X, y, record: bool = True):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(X, y)
    return [w for w in caught if issubclass(w.category, ExportedGraphWarning)]


def _inspect(capsys, tmp_path, model: onnx.ModelProto) -> str:
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    assert main(["inspect", str(path)]) == 0
    return capsys.readouterr().out


# ---- exporter constants -------------------------------------------------------------------------


def test_dynamo_scalar_constants_are_not_default_weights() -> None:
    torch.manual_seed(0)
    net = Attention(distinct_norms=True)
    model = _export(net, T * F, "dynamo", training=True)
    scalars = _scalars(model)
    # the artefact is there: the mask's fill value read by Where, the attention scale
    assert "Where" in [op for ops in scalars.values() for op in ops], scalars
    defaults = default_weights_to_train(model, "logits")
    assert not set(defaults) & set(scalars)
    # every torch parameter and nothing else (q.weight is there as its folded transpose)
    assert len(defaults) == len(list(net.parameters()))


@pytest.mark.parametrize("route", ["full", "partial"])
def test_transformer_with_mask_constant_trains_as_torch(route: str) -> None:
    torch.manual_seed(0)
    net = Attention(distinct_norms=True)
    model = _export(net, T * F, "dynamo", training=True)
    X, y = _data()
    common = dict(learning_rate=LR, batch_size=len(X), max_iter=4, shuffle=False)
    if route == "full":
        trainer = OrtGradientOptimizer(add_loss_output(model, "cross_entropy"), **common)
    else:
        trainer = OrtGradientForwardBackwardOptimizer(model, learning_loss="cross_entropy", **common)
    assert _fit(trainer, X, y) == []  # distinct parameters, no BatchNorm: nothing to warn about
    np.testing.assert_allclose(trainer.train_losses_, _torch_losses(net, X, y, 4), rtol=1e-4)


def test_float_initializers_that_only_feed_masks_or_indices_are_not_weights() -> None:
    """A float tensor read only by a comparison (the mask of a Where) and as a Range bound has no
    gradient: not a default weight; the float tensor Where selects from is."""
    X = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])
    Y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3])
    inits = [
        numpy_helper.from_array(np.array([0.5, 0.0, -0.5], np.float32), "threshold"),
        numpy_helper.from_array(np.array(3.0, np.float32), "limit"),
        numpy_helper.from_array(np.array(0.0, np.float32), "start"),
        numpy_helper.from_array(np.array(1.0, np.float32), "delta"),
        numpy_helper.from_array(np.ones(3, np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("Less", ["X", "threshold"], ["mask"]),
        helper.make_node("Range", ["start", "limit", "delta"], ["ramp"]),
        helper.make_node("Mul", ["X", "scale"], ["scaled"]),
        helper.make_node("Where", ["mask", "scaled", "X"], ["picked"]),
        helper.make_node("Add", ["picked", "ramp"], ["Y"]),
    ]
    graph = helper.make_graph(nodes, "masks", [X], [Y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert default_weights_to_train(model, "Y") == ["scale"]


# ---- merged (tied) parameters -----------------------------------------------------------------


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript-eval"])
def test_merged_layernorm_parameters_warn_at_fit_and_in_inspect(exporter, capsys, tmp_path) -> None:
    """Both LayerNorms start at gamma = 1, beta = 0: the exporter keeps one tensor of each
    (dynamo: read by both nodes; TorchScript eval: through Identity nodes)."""
    torch.manual_seed(0)
    model = _export(Attention(distinct_norms=False), T * F, exporter.split("-")[0], training=False)
    X, y = _data()
    trainer = OrtGradientForwardBackwardOptimizer(
        model, learning_loss="cross_entropy", learning_rate=LR, batch_size=8, max_iter=2
    )
    caught = _fit(trainer, X, y)
    assert len(caught) == 1, [str(w.message) for w in caught]  # once per graph, not per epoch
    message = str(caught[0].message)
    assert "norm1.weight" in message
    assert "norm2" in message
    assert "dynamo=False" in message
    assert "do_constant_folding=False" in message
    # the warning is a class to filter: genuine tying (a shared embedding) is legitimate
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=ExportedGraphWarning)
        OrtGradientForwardBackwardOptimizer(
            model, learning_loss="cross_entropy", learning_rate=LR, batch_size=8, max_iter=1
        ).fit(X, y)
    printed = _inspect(capsys, tmp_path, model)
    assert "norm1.weight" in printed.split("\nwarning: ", 1)[1]


def test_one_to_one_export_warns_nothing(capsys, tmp_path) -> None:
    """TorchScript in training mode without constant folding keeps every parameter."""
    torch.manual_seed(0)
    model = _export(Attention(distinct_norms=False), T * F, "torchscript", training=True)
    X, y = _data()
    trainer = OrtGradientOptimizer(
        add_loss_output(model, "cross_entropy"), learning_rate=LR, batch_size=8, max_iter=1
    )
    assert _fit(trainer, X, y) == []
    assert "\nwarning: " not in _inspect(capsys, tmp_path, model)


# ---- BatchNorm folded into Conv -----------------------------------------------------------------


@pytest.mark.parametrize("exporter", ["torchscript-eval", "dynamo"])
def test_folded_batchnorm_is_reported(exporter, capsys, tmp_path) -> None:
    torch.manual_seed(0)
    model = _export(SmallCNN(), 3 * 8 * 8, exporter.split("-")[0], training=exporter == "dynamo")
    ops = {n.op_type for n in model.graph.node}
    assert "Conv" in ops
    assert "BatchNormalization" not in ops  # the exporter folded it
    X = np.random.default_rng(0).standard_normal((8, 3 * 8 * 8)).astype(np.float32)
    y = np.arange(8) % N_CLASSES
    trainer = OrtGradientForwardBackwardOptimizer(
        model, learning_loss="cross_entropy", learning_rate=LR, batch_size=8, max_iter=1
    )
    caught = _fit(trainer, X, y)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "BatchNormalization" in message
    assert "may have" in message
    assert "training=torch.onnx.TrainingMode.TRAINING" in message
    assert "BatchNormalization" in _inspect(capsys, tmp_path, model).split("\nwarning: ", 1)[1]


def test_batchnorm_kept_by_a_training_export_is_not_reported(capsys, tmp_path) -> None:
    torch.manual_seed(0)
    model = _export(SmallCNN(), 3 * 8 * 8, "torchscript", training=True)
    assert "BatchNormalization" in {n.op_type for n in model.graph.node}
    assert "\nwarning: " not in _inspect(capsys, tmp_path, model)


class Scaled(nn.Module):
    """A 0-d parameter (a learned temperature) and a float buffer (torch does not train it)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, N_CLASSES)
        self.temperature = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("scale", torch.tensor([2.0, 3.0, 4.0, 5.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * self.scale) * self.temperature


def test_torch_tags_decide_for_0d_parameters_and_buffers(capsys, tmp_path) -> None:
    """The dynamo exporter tags parameters and buffers: its 0-d parameter is trained, its buffer
    is not. The TorchScript exporter tags nothing: a 0-d tensor is left out, and inspect says how
    to train it."""
    dynamo = _export(Scaled(), 4, "dynamo", training=True)
    assert sorted(default_weights_to_train(dynamo, "logits")) == ["lin.bias", "lin.weight", "temperature"]
    torchscript = _export(Scaled(), 4, "torchscript", training=True)
    assert sorted(default_weights_to_train(torchscript, "logits")) == ["lin.bias", "lin.weight", "scale"]
    printed = _inspect(capsys, tmp_path, torchscript)
    assert "temperature: float32 (): a 0-d constant (name it in weights_to_train" in printed
