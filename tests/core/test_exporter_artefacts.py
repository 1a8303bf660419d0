"""Parameters a torch exporter folded into copies or dropped (issue 26, items 2 and 4).

- The dynamo exporter writes GPT-2's output weight, tied to the token embedding, as a second,
  pre-transposed initializer: every route trained the two apart from each other, silently.
  Trained initializers equal to a Transpose, Reshape or leading Slice of another now warn
  (ExportedGraphWarning) on every route, naming both and the fix.
- The dynamo exporter drops zero biases (a fresh MultiheadAttention's ``out_proj.bias``, a
  zero-initialised Conv bias, GPT-2's zero-initialised Conv1D biases): they stayed zero where
  torch trains them, silently. Its graph metadata names torch's parameters: each one the export
  read but holds nowhere now warns, naming it and the export that keeps it.
"""

from __future__ import annotations

import io
import re
import time
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_train_core import (
    ExportedGraphWarning,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core._artefacts import dropped_parameters, folded_copies
from ort_train_core.graph import MAX_IR_VERSION, default_weights_to_train

rng = np.random.default_rng(0)


def _exported_warnings(run: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, ExportedGraphWarning)]


# ---- a hand-made graph: a transposed, a reshaped and a sliced copy ---------------------------

W = rng.standard_normal((6, 3)).astype(np.float32)
V = rng.standard_normal((3, 6)).astype(np.float32)
E = rng.standard_normal((6, 3)).astype(np.float32)


def _copies_model(copies: bool = True) -> onnx.ModelProto:
    """Y = X W + X WT^T + X V^T + X R + X E + sum(ES, axis 0), where WT = W^T, R = V reshaped
    to [6, 3] and ES = E[:2] (or, with ``copies=False``, independent random tensors)."""
    other = rng.standard_normal
    inits = {
        "W": W,
        "WT": W.T.copy() if copies else other((3, 6)).astype(np.float32),
        "V": V,
        "R": V.reshape(6, 3) if copies else other((6, 3)).astype(np.float32),
        "E": E,
        "ES": E[:2].copy() if copies else other((2, 3)).astype(np.float32),
        "axes": np.array([0], dtype=np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["a"]),
        helper.make_node("Gemm", ["X", "WT"], ["b"], transB=1),
        helper.make_node("Gemm", ["X", "V"], ["c"], transB=1),
        helper.make_node("MatMul", ["X", "R"], ["d"]),
        helper.make_node("MatMul", ["X", "E"], ["e"]),
        helper.make_node("ReduceSum", ["ES", "axes"], ["f"], keepdims=1),
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Add", ["c", "d"], ["cd"]),
        helper.make_node("Add", ["e", "f"], ["ef"]),
        helper.make_node("Add", ["ab", "cd"], ["abcd"]),
        helper.make_node("Add", ["abcd", "ef"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "copies",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


X = rng.standard_normal((16, 6)).astype(np.float32)
Y = rng.standard_normal((16, 3)).astype(np.float32)


def _routes(model: onnx.ModelProto) -> dict[str, Any]:
    """A fit (or a module's construction) on each route."""
    kwargs = {"max_iter": 1, "batch_size": 16}

    def torch_module() -> None:
        torch = pytest.importorskip("torch")  # noqa: F841
        from ort_train_torch import OnnxModule

        OnnxModule(model)

    def sklearn_estimator() -> None:
        from ort_train_sklearn import OnnxModelRegressor

        OnnxModelRegressor(model, max_iter=1, batch_size=16).fit(X, Y)

    return {
        "full": lambda: OrtGradientOptimizer(add_loss_output(model), **kwargs).fit(X, Y),
        "partial": lambda: OrtGradientForwardBackwardOptimizer(model, **kwargs).fit(X, Y),
        "OnnxModule": torch_module,
        "OnnxModelRegressor": sklearn_estimator,
    }


def _numpy_copies() -> set[tuple[str, str]]:
    """The (copy, original) pairs, found by numpy on the values of the graph."""
    values = {i.name: numpy_helper.to_array(i) for i in _copies_model().graph.initializer}
    pairs = set()
    for c in values:
        for o in values:
            if c == o or values[c].dtype != np.float32:
                continue
            a, b = values[c], values[o]
            if (
                (a.shape == b.T.shape and np.array_equal(a, b.T))
                or (a.shape != b.shape and a.size == b.size and np.array_equal(a.ravel(), b.ravel()))
                or (a.size < b.size and np.array_equal(a, b[: a.shape[0]]))
            ):
                pairs.add((c, o))
    return pairs


@pytest.mark.parametrize("route", ["full", "partial", "OnnxModule", "OnnxModelRegressor"])
def test_folded_copies_warn_on_every_route(route: str) -> None:
    messages = _exported_warnings(_routes(_copies_model())[route])
    assert len(messages) == 1, messages
    message = messages[0]
    # each pair numpy finds, named with how (the later initializer of an equal-size pair is
    # named the copy; a smaller one is the slice)
    assert {("WT", "W"), ("W", "WT"), ("R", "V"), ("V", "R"), ("ES", "E")} == _numpy_copies()
    assert "'WT' holds 'W' transposed (perm=[1, 0])" in message
    assert "'R' holds 'V' reshaped to [6, 3]" in message
    assert "'ES' holds 'E' sliced to its leading [2, 3] block" in message
    assert "dynamo=False" in message
    assert "weights_to_train" in message


@pytest.mark.parametrize("route", ["full", "partial", "OnnxModule"])
def test_independent_tensors_do_not_warn(route: str) -> None:
    assert _exported_warnings(_routes(_copies_model(copies=False))[route]) == []


def test_leaving_the_copies_out_of_weights_to_train_silences_it() -> None:
    model = _copies_model()
    trainer = OrtGradientForwardBackwardOptimizer(
        model, weights_to_train=["W", "V", "E"], max_iter=1, batch_size=16
    )
    assert _exported_warnings(lambda: trainer.fit(X, Y)) == []


def test_equal_parameters_and_constant_tensors_are_not_copies() -> None:
    """Deep-copied layers hold equal, distinct parameters; zeros, ones and an identity matrix
    equal slices and transposes of many tensors: none is a copy."""
    inits = {
        "layer0": W,
        "layer1": W.copy(),
        "zeros": np.zeros((6, 3), np.float32),
        "zeros_t": np.zeros((3, 6), np.float32),
        "eye": np.eye(6, dtype=np.float32),
        "eye_slice": np.eye(6, dtype=np.float32)[:3],
    }
    graph = helper.make_graph([], "g", [], [], [numpy_helper.from_array(v, k) for k, v in inits.items()])
    assert folded_copies(helper.make_model(graph), list(inits)) == []
    # the same exact copy made by an exporter (TorchScript's onnx:: name) is one
    inits["onnx::MatMul_7"] = inits.pop("layer1")
    graph = helper.make_graph([], "g", [], [], [numpy_helper.from_array(v, k) for k, v in inits.items()])
    found = folded_copies(helper.make_model(graph), list(inits))
    assert found == [("onnx::MatMul_7", "layer0", "an exact copy")]


def test_twenty_thousand_initializers_are_compared_in_linear_time() -> None:
    """Issue 26 item 7's size: 20 000 initializers (biases of equal shapes, many zeros), one
    transposed copy among them; measured 0.2 s (100 000: 1.5 s) on one core."""
    n = 20_000
    inits = [numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), f"b{k}") for k in range(n)]
    inits += [numpy_helper.from_array(np.zeros(8, np.float32), f"z{k}") for k in range(n // 4)]
    inits += [numpy_helper.from_array(W, "W"), numpy_helper.from_array(W.T.copy(), "WT")]
    model = helper.make_model(helper.make_graph([], "g", [], [], inits))
    names = [i.name for i in inits]
    start = time.perf_counter()
    found = folded_copies(model, names)
    elapsed = time.perf_counter() - start
    assert found == [("WT", "W", "transposed (perm=[1, 0])")]
    assert elapsed < 10, elapsed  # all pairs would be 3e8 comparisons


# ---- real dynamo exports -------------------------------------------------------------------

torch = pytest.importorskip("torch")
nn = torch.nn


def _dynamo(net: Any, args: tuple[Any, ...]) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.onnx.export(net, args, dynamo=True, verbose=False).model_proto
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


@pytest.fixture(scope="module")
def gpt2() -> tuple[onnx.ModelProto, Any]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16)
    lm = transformers.GPT2LMHeadModel(config).eval()

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = lm

        def forward(self, ids: Any) -> Any:
            return self.m(input_ids=ids, use_cache=False).logits

    return _dynamo(Logits(), (torch.randint(0, 50, (2, 8)),)), lm


def test_gpt2_tied_output_weight_and_zero_biases_warn(gpt2: tuple[onnx.ModelProto, Any]) -> None:
    from ort_train_torch import OnnxModule

    model, lm = gpt2
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    wte = lm.transformer.wte.weight.detach().numpy()
    # numpy: the initializer equal to the tied weight, and its transposed copy
    original = [n for n, v in values.items() if v.shape == wte.shape and np.array_equal(v, wte)]
    copy = [n for n, v in values.items() if v.shape == wte.T.shape and np.array_equal(v, wte.T)]
    assert len(original) == len(copy) == 1
    weights = default_weights_to_train(model, [o.name for o in model.graph.output])
    assert {original[0], copy[0]} <= set(weights)  # both trained: apart, without the fix
    messages = _exported_warnings(lambda: OnnxModule(model))
    assert len(messages) == 1
    assert f"{copy[0]!r} holds {original[0]!r} transposed (perm=[1, 0])" in messages[0]
    # torch's zero-initialised Conv1D biases have no tensor in the graph
    zero_biases = sorted(n for n, p in lm.named_parameters() if n.endswith("bias") and not p.any())
    held = {n.removeprefix("m.") for n in values} | {n.removeprefix("m.") for n in _folded(model)}
    dropped = [f"m.{n}" for n in zero_biases if n not in held and "ln_" not in n]  # LayerNorm's merged
    assert dropped
    assert sorted(dropped_parameters(model)) == dropped
    assert f"torch parameters {dropped_parameters(model)} appear dropped" in messages[0]


def test_gpt2_default_weights_are_torch_parameters_and_their_copies(
    gpt2: tuple[onnx.ModelProto, Any],
) -> None:
    """dynamo folds the causal attention mask into a float [2, 1, 8, 8] initializer: it was a
    default weight, so every route trained the mask. The defaults are now exactly the tensors
    numpy finds equal to a torch parameter, its transpose or its leading rows."""
    model, lm = gpt2
    params = [p.detach().numpy() for p in lm.parameters()]

    def from_torch(v: np.ndarray) -> bool:
        for p in params:
            if v.shape == p.shape and np.array_equal(v, p):
                return True
            if v.shape == p.T.shape and np.array_equal(v, p.T):
                return True
            rows = v.reshape(-1, *p.shape[1:]) if p.ndim and v.size % max(1, p[0].size) == 0 else None
            if rows is not None and len(rows) < len(p) and np.array_equal(rows, p[: len(rows)]):
                return True
        return False

    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == 1}
    expected = {n for n, v in values.items() if v.ndim and from_torch(v)}
    weights = set(default_weights_to_train(model, [o.name for o in model.graph.output]))
    assert weights == expected
    masks = [n for n, v in values.items() if v.ndim == 4]
    assert masks
    assert not set(masks) & weights


def _folded(model: onnx.ModelProto) -> set[str]:
    text = " ".join(p.value for v in model.graph.value_info for p in v.metadata_props)
    return set(re.findall(r"'([\w.]+)'", text))


class AttentionConv(nn.Module):
    def __init__(self, zero_biases: bool) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(8, 2, batch_first=True)  # out_proj.bias starts at 0
        self.conv = nn.Conv1d(8, 4, 1)
        with torch.no_grad():
            if zero_biases:
                self.conv.bias.zero_()
            else:
                self.att.out_proj.bias.uniform_(-1, 1)

    def forward(self, x: Any) -> Any:
        y, _ = self.att(x, x, x, need_weights=False)
        return self.conv(y.transpose(1, 2)).mean(2)


@pytest.fixture(scope="module")
def attention_exports() -> dict[str, onnx.ModelProto]:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    out = {"zero": _dynamo(AttentionConv(True), (x,)), "nonzero": _dynamo(AttentionConv(False), (x,))}
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            AttentionConv(True),
            (x,),
            buffer,
            dynamo=False,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
        )
    out["torchscript"] = onnx.load_from_string(buffer.getvalue())
    return out


def test_dropped_zero_biases_warn(attention_exports: dict[str, onnx.ModelProto]) -> None:
    from ort_train_torch import OnnxModule

    model = attention_exports["zero"]
    held = {i.name for i in model.graph.initializer}
    assert "att.out_proj.bias" not in held  # what dynamo did
    assert "conv.bias" not in held
    assert dropped_parameters(model) == ["att.out_proj.bias", "conv.bias"]
    messages = _exported_warnings(lambda: OnnxModule(model))
    assert len(messages) == 1
    assert "torch parameters ['att.out_proj.bias', 'conv.bias'] appear dropped" in messages[0]
    assert "do_constant_folding=False" in messages[0]
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)  # the export's static batch
    y = rng.standard_normal((2, 4)).astype(np.float32)
    trainer = OrtGradientForwardBackwardOptimizer(model, max_iter=1, batch_size=2)
    messages = _exported_warnings(lambda: trainer.fit(x, y))
    assert "appear dropped" in messages[0]


@pytest.mark.parametrize("export", ["nonzero", "torchscript"])
def test_nothing_dropped_warns_nothing(attention_exports: dict[str, onnx.ModelProto], export: str) -> None:
    from ort_train_torch import OnnxModule

    model = attention_exports[export]
    assert dropped_parameters(model) == []
    if export == "torchscript":  # the fix the warning names keeps the zero biases
        held = {i.name for i in model.graph.initializer}
        assert {"att.out_proj.bias", "conv.bias"} <= held
    assert [m for m in _exported_warnings(lambda: OnnxModule(model)) if "dropped" in m] == []
