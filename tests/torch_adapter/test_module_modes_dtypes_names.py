"""OnnxModule against torch on three points a tester found wrong:

- the mode picks the forward, not the grad mode: ``train()`` under ``torch.no_grad()`` (or with
  every parameter frozen) normalises BatchNorm with the batch's statistics and updates the
  running ones, as torch does; ``eval()`` runs the inference session;
- ``.double()`` on a float32 graph converts the parameters, not the graph: the forward says so
  before any session runs, naming the parameter and the fix, and ``.float()`` undoes it;
- an initializer named like an attribute the module already has (``training``, ``_model``)
  becomes a renamed parameter that trains, instead of crashing the construction.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import ort_train_core
from batchnorm_support import export_training
from ort_train_torch import OnnxModule

TOL = 1e-5


def _batchnorm_pair() -> tuple[nn.Module, OnnxModule, torch.Tensor]:
    """A BatchNorm1d network in torch and as an OnnxModule, with the same values, statistics
    away from their defaults, and a batch far from them (so that batch and running statistics
    give different outputs)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=0.3), nn.ReLU(), nn.Linear(6, 2))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        net[1].running_mean.uniform_(-1.0, 1.0, generator=gen)
        net[1].running_var.uniform_(0.5, 2.0, generator=gen)
    x = torch.randn(10, 4, generator=gen) * 3 + 1
    model = export_training(copy.deepcopy(net), x)
    # the export traces a training forward, which moves torch's running statistics: both
    # start from the exported values
    exported = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in model.graph.initializer}
    with torch.no_grad():
        for name, buffer in net.named_buffers():
            if name in exported:
                buffer.copy_(exported[name])
    return net, OnnxModule(model), x


def _statistics(
    net: nn.Module, module: OnnxModule
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The running statistics of both, by torch's buffer name."""
    ours = {module.onnx_buffer_names[attr]: b.detach().clone() for attr, b in module.named_buffers()}
    theirs = {n: b.detach().clone() for n, b in net.named_buffers() if not n.endswith("num_batches_tracked")}
    assert set(ours) == set(theirs)
    return ours, theirs


# ---- the mode picks the forward -----------------------------------------------------------------
@pytest.mark.parametrize("case", ["no_grad", "frozen"])
def test_train_mode_without_gradient_uses_and_updates_batch_statistics_as_torch(case: str) -> None:
    net, module, x = _batchnorm_pair()
    net.train()
    module.train()
    before, _ = _statistics(net, module)
    if case == "frozen":  # gradients enabled, nothing requiring one
        for p in [*net.parameters(), *module.parameters()]:
            p.requires_grad_(False)
    for batch in (x, x[:6] * 0.5 - 1):  # twice: the second forward starts from the updated ones
        with torch.set_grad_enabled(case != "no_grad"):
            expected, got = net(batch), module(batch)
        assert not got.requires_grad
        torch.testing.assert_close(got, expected, atol=TOL, rtol=TOL)
        ours, theirs = _statistics(net, module)
        for name, value in theirs.items():
            torch.testing.assert_close(ours[name], value, atol=TOL, rtol=TOL, msg=name)
    assert not all(torch.equal(before[n], ours[n]) for n in ours)
    # nothing kept for a backward that cannot come
    assert all(not fb._pending for fb in module._graphs.values())

    net.eval()
    module.eval()
    with torch.no_grad():
        torch.testing.assert_close(module(x), net(x), atol=TOL, rtol=TOL)
    after, _ = _statistics(net, module)
    for name, value in ours.items():
        torch.testing.assert_close(after[name], value, atol=0, rtol=0, msg=name)


def test_train_mode_under_no_grad_then_a_training_step_match_torch() -> None:
    """A no_grad forward in train mode (a validation pass someone forgot to put in eval) leaves
    the module where torch's is: the next step's loss, gradients and statistics agree."""
    net, module, x = _batchnorm_pair()
    net.train()
    module.train()
    with torch.no_grad():
        net(x[:5])
        module(x[:5])
    target = torch.randn(10, 2, generator=torch.Generator().manual_seed(2))
    nn.functional.mse_loss(net(x), target).backward()
    nn.functional.mse_loss(module(x), target).backward()
    grads = {module.onnx_names[a]: p.grad for a, p in module.named_parameters()}
    for name, p in net.named_parameters():
        assert p.grad is not None
        got = grads[name]
        assert got is not None
        torch.testing.assert_close(got, p.grad, atol=TOL, rtol=1e-4, msg=name)
    ours, theirs = _statistics(net, module)
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, atol=TOL, rtol=TOL, msg=name)


def test_train_mode_under_no_grad_keeps_statistics_on_an_empty_batch() -> None:
    """Without a gradient an empty batch runs in train mode, as in torch, which leaves the
    running statistics as they are (the batch has none)."""
    net, module, x = _batchnorm_pair()
    module.train()
    net.train()
    before, _ = _statistics(net, module)
    with torch.no_grad():
        out = module(x[:0])
        expected = net(x[:0])
    assert out.shape == expected.shape == (0, 2)
    after, theirs = _statistics(net, module)
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, atol=0, rtol=0, msg=name)
        torch.testing.assert_close(theirs[name], value, atol=0, rtol=0, msg=name)


def test_train_mode_under_no_grad_keeps_dropout_active() -> None:
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 1))
    x = torch.randn(8, 4)
    module = OnnxModule(export_training(copy.deepcopy(net), x))
    net.eval()
    reference = net(x).detach()
    module.train()
    with torch.no_grad():
        dropped = module(x)
    assert not torch.allclose(dropped, reference, atol=1e-4)
    module.eval()
    with torch.no_grad():
        torch.testing.assert_close(module(x), reference, atol=TOL, rtol=TOL)


# ---- the graph fixes the dtypes -----------------------------------------------------------------
def _mlp_pair() -> tuple[nn.Module, OnnxModule, torch.Tensor]:
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(6, 4)
    return net, OnnxModule(export_training(copy.deepcopy(net), x)), x


DTYPE_ERROR = (
    r"^OnnxModule: parameter 'w_0_weight' \('0\.weight'\) is torch\.{new} but the ONNX graph computes it "
    r"in float32: OnnxModule cannot change the graph's dtype; call module\.float\(\) \(or convert the "
    r"ONNX graph to {new} before wrapping it\)$"
)


@pytest.mark.parametrize("convert", ["double", "to_float64", "half"])
@pytest.mark.parametrize("mode", ["train", "eval", "no_grad"])
def test_a_dtype_change_is_refused_at_forward_and_float_undoes_it(
    convert: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    net, module, x = _mlp_pair()
    new = {"double": torch.float64, "to_float64": torch.float64, "half": torch.float16}[convert]
    converted = module.to(torch.float64) if convert == "to_float64" else getattr(module, convert)()
    assert converted is module
    assert module.w_0_weight.dtype == new
    module.train(mode == "train")

    # the check comes before any session: none may run
    cls = ort_train_core.OrtGradientForwardBackward

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a session ran")

    with monkeypatch.context() as m:
        m.setattr(cls, "run_forward", refuse)
        m.setattr(cls, "forward", refuse)
        message = DTYPE_ERROR.format(new=str(new).removeprefix("torch."))
        for batch in (x, x.to(new)):  # an input of the module's new dtype too: the module is wrong
            with torch.set_grad_enabled(mode != "no_grad"), pytest.raises(TypeError, match=message):
                module(batch)
        with pytest.raises(TypeError, match=message):
            module.to_onnx()

    module.float()
    reference = copy.deepcopy(net).to(new).float()  # the same round trip (float16 rounds)
    with torch.set_grad_enabled(mode != "no_grad"):
        torch.testing.assert_close(module(x), reference(x), atol=TOL, rtol=TOL)


def test_a_buffer_of_another_dtype_is_named() -> None:
    _, module, x = _batchnorm_pair()
    attr = next(iter(module.onnx_buffer_names))
    module.register_buffer(attr, module.get_buffer(attr).double())
    with pytest.raises(
        TypeError, match=rf"^OnnxModule: buffer '{attr}' \(.*\) is torch\.float64 .*module\.float\(\)"
    ):
        module(x)
    module.float()
    module(x)


def test_a_device_move_keeps_the_dtypes() -> None:
    """``.to(device)`` is not a dtype change; nor is ``.to(torch.float32)`` on a float32 graph."""
    net, module, x = _mlp_pair()
    assert module.to("cpu").to(torch.float32) is module
    torch.testing.assert_close(module(x), net(x), atol=TOL, rtol=TOL)


@pytest.mark.cuda
def test_cuda_device_move_works_and_a_dtype_change_is_refused() -> None:
    net, module, x = _mlp_pair()
    net, module, x = net.cuda(), module.to("cuda"), x.cuda()
    torch.testing.assert_close(module(x), net(x), atol=TOL, rtol=TOL)
    with torch.no_grad():  # the training forward without autograd on the GPU
        torch.testing.assert_close(module(x), net(x), atol=TOL, rtol=TOL)
    module.to("cuda", torch.float64)
    with pytest.raises(TypeError, match=r"is torch\.float64 but the ONNX graph computes it in float32"):
        module(x)
    module.float()
    out = module(x)
    out.sum().backward()
    assert module.w_0_weight.grad is not None
    assert module.w_0_weight.grad.device.type == "cuda"


@pytest.mark.cuda
def test_cuda_train_mode_under_no_grad_updates_statistics_as_torch() -> None:
    net, module, x = _batchnorm_pair()
    net, module, x = net.cuda().train(), module.to("cuda").train(), x.cuda()
    with torch.no_grad():
        torch.testing.assert_close(module(x), net(x), atol=TOL, rtol=TOL)
    ours, theirs = _statistics(net, module)
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, atol=TOL, rtol=TOL, msg=name)


# ---- initializers named like the module's own attributes ----------------------------------------
def _named_like_attributes(names: list[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Y = sum_k tanh(X * A_k + c_k): one (A_k, c_k) pair per name, A_k called ``name`` and c_k
    ``name`` + '_c' (``training`` and ``training_c``)."""
    gen = np.random.default_rng(6)
    values: dict[str, np.ndarray] = {}
    nodes = []
    terms = []
    for k, name in enumerate(names):
        values[name] = gen.normal(size=3).astype(np.float32)
        values[f"{name}_c"] = gen.normal(size=3).astype(np.float32)
        nodes += [
            helper.make_node("Mul", ["X", name], [f"m{k}"]),
            helper.make_node("Add", [f"m{k}", f"{name}_c"], [f"a{k}"]),
            helper.make_node("Tanh", [f"a{k}"], [f"t{k}"]),
        ]
        terms.append(f"t{k}")
    total = terms[0]
    for k, term in enumerate(terms[1:]):  # Add: onnxruntime-training has no gradient for Sum
        total_k = f"s{k}"
        nodes.append(helper.make_node("Add", [total, term], [total_k]))
        total = total_k
    nodes.append(helper.make_node("Identity", [total], ["Y"]))
    graph = helper.make_graph(
        nodes,
        "named",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(v, k) for k, v in values.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, values


def _check_trains_as_torch(names: list[str]) -> OnnxModule:
    model, values = _named_like_attributes(names)
    module = OnnxModule(model)
    assert sorted(module.onnx_names.values()) == sorted(values)
    assert set(module.state_dict()) == set(module.onnx_names)
    # the module's own attributes are intact
    assert module.training is True
    assert module.input_names == ["X"]
    assert isinstance(module._model, onnx.ModelProto)
    params = {name: torch.from_numpy(v.copy()).requires_grad_() for name, v in values.items()}
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(7))
    expected = torch.stack([torch.tanh(x * params[n] + params[f"{n}_c"]) for n in names]).sum(0)
    got = module(x)
    torch.testing.assert_close(got, expected, atol=TOL, rtol=TOL)
    got.square().sum().backward()
    expected.square().sum().backward()
    for attr, name in module.onnx_names.items():
        grad = module.get_parameter(attr).grad
        assert grad is not None, attr
        torch.testing.assert_close(grad, params[name].grad, atol=TOL, rtol=1e-4, msg=name)
    module.eval()
    assert module.training is False
    with torch.no_grad():
        torch.testing.assert_close(module(x), expected.detach(), atol=TOL, rtol=TOL)
    return module


def test_initializers_named_training_and_model_are_renamed_and_train() -> None:
    module = _check_trains_as_torch(["training", "_model"])
    assert module.onnx_names["training_1"] == "training"
    assert module.onnx_names["_model_1"] == "_model"
    assert {"training_1", "_model_1"} <= set(module.state_dict())


def test_every_name_the_module_uses_is_renamed() -> None:
    """Every instance attribute of nn.Module (those this torch version sets) and of OnnxModule,
    and a few of their methods, as initializer names in one graph."""
    instance = [*vars(nn.Module()), *OnnxModule._INSTANCE_ATTRIBUTES]
    module = _check_trains_as_torch(sorted({*instance, "forward", "save", "to_onnx", "_params"}))
    # the list of OnnxModule's instance attributes is complete: a new attribute must join it
    assert set(vars(module)) <= {*vars(nn.Module()), *OnnxModule._INSTANCE_ATTRIBUTES}
    _, bn_module, _ = _batchnorm_pair()  # nor one with buffers
    assert set(vars(bn_module)) <= {*vars(nn.Module()), *OnnxModule._INSTANCE_ATTRIBUTES}
