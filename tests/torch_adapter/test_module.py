"""OnnxModule against pure torch: outputs and gradients (torch autograd as the reference),
training with torch optimisers, composition, export, zero copy, and errors."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn
from torch_models import onnx_from_torch_mlp, torch_mlp, torch_weights_as_onnx

import ort_train_core
from ort_train_core import GraphNotDifferentiableError
from ort_train_torch import OnnxModule, ortvalue_from_tensor, tensor_from_ortvalue

ATOL = 1e-5


def _assert_grads_match(module: OnnxModule, net: nn.Sequential) -> None:
    expected = {}
    for k, lin in enumerate(m for m in net if isinstance(m, nn.Linear)):
        expected[f"W{k}"] = lin.weight.grad.T
        expected[f"b{k}"] = lin.bias.grad
    for name, grad in expected.items():
        got = getattr(module, name).grad
        assert got is not None, name
        torch.testing.assert_close(got, grad, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("sizes", [[5, 3], [6, 8, 2]], ids=["linear", "mlp"])
@pytest.mark.parametrize("input_grad", [False, True])
def test_gradients_match_torch_autograd(sizes, input_grad):
    net = torch_mlp(sizes, seed=1)
    module = OnnxModule(onnx_from_torch_mlp(net))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, sizes[0], generator=gen)
    target = torch.randn(16, sizes[-1], generator=gen)
    x_ours = x.clone().requires_grad_(input_grad)
    x_ref = x.clone().requires_grad_(input_grad)
    out = module(x_ours)
    torch.testing.assert_close(out, net(x), atol=ATOL, rtol=1e-5)
    nn.functional.mse_loss(out, target).backward()
    nn.functional.mse_loss(net(x_ref), target).backward()
    _assert_grads_match(module, net)
    if input_grad:
        torch.testing.assert_close(x_ours.grad, x_ref.grad, atol=ATOL, rtol=1e-5)
    else:
        assert x_ours.grad is None


def test_five_epochs_of_sgd_match_torch():
    net = torch_mlp([4, 10, 1], seed=2)
    module = OnnxModule(onnx_from_torch_mlp(net))
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(60, 4, generator=gen)
    y = (X[:, :1] * 2 - X[:, 1:2]).sin()
    opt_ours = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    opt_ref = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for _ in range(5):
        for start in range(0, 60, 16):  # a shorter last batch: the batch size varies
            xb, yb = X[start : start + 16], y[start : start + 16]
            for model, opt in ((module, opt_ours), (net, opt_ref)):
                opt.zero_grad()
                nn.functional.mse_loss(model(xb), yb).backward()
                opt.step()
    reference = torch_weights_as_onnx(net)
    for name, value in reference.items():
        assert not torch.allclose(value, torch.tensor(numpy_helper.to_array(_init(module, name))))
        torch.testing.assert_close(getattr(module, name).detach(), value, atol=1e-4, rtol=1e-4)


def _init(module: OnnxModule, name: str) -> onnx.TensorProto:
    return next(i for i in module._model.graph.initializer if i.name == name)


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
def test_composes_between_torch_layers(optimizer):
    """Linear -> OnnxModule(MLP) -> Linear trains like the all-torch network."""
    torch.manual_seed(4)
    inner = torch_mlp([8, 12, 4], seed=5)
    pre, post = nn.Linear(3, 8), nn.Linear(4, 1)
    ref = nn.Sequential(copy.deepcopy(pre), *copy.deepcopy(inner), copy.deepcopy(post))
    ours = nn.Sequential(pre, OnnxModule(onnx_from_torch_mlp(inner)), post)
    gen = torch.Generator().manual_seed(6)
    X, y = torch.randn(32, 3, generator=gen), torch.randn(32, 1, generator=gen)
    opts = [optimizer(m.parameters(), lr=0.01) for m in (ours, ref)]
    for _ in range(10):
        for model, opt in zip((ours, ref), opts):
            opt.zero_grad()
            nn.functional.mse_loss(model(X), y).backward()
            opt.step()
    torch.testing.assert_close(ours(X), ref(X), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours[0].weight, ref[0].weight, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours[1].W0, ref[1].weight.T, atol=1e-5, rtol=1e-4)


def test_shared_module_applied_twice_accumulates_gradients():
    net = torch_mlp([3, 5, 3], seed=7)
    module = OnnxModule(onnx_from_torch_mlp(net))
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(8))
    module(module(x)).pow(2).sum().backward()
    net(net(x)).pow(2).sum().backward()
    _assert_grads_match(module, net)


# ---- several inputs and outputs ---------------------------------------------------------------
def _two_in_two_out() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(9)
    values = {
        "A": rng.standard_normal((3, 2)).astype(np.float32),
        "c": rng.standard_normal(2).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x1", "A"], ["p"]),
        helper.make_node("Mul", ["p", "x2"], ["q"]),
        helper.make_node("Add", ["q", "c"], ["out_sum"]),
        helper.make_node("Tanh", ["p"], ["out_tanh"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [
            helper.make_tensor_value_info("x1", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("x2", TensorProto.FLOAT, ["N", 2]),
        ],
        [
            helper.make_tensor_value_info("out_sum", TensorProto.FLOAT, ["N", 2]),
            helper.make_tensor_value_info("out_tanh", TensorProto.FLOAT, ["N", 2]),
        ],
        [numpy_helper.from_array(v, k) for k, v in values.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, values


def test_several_inputs_and_outputs_match_torch():
    model, values = _two_in_two_out()
    module = OnnxModule(model)
    A = torch.tensor(values["A"], requires_grad=True)
    c = torch.tensor(values["c"], requires_grad=True)
    gen = torch.Generator().manual_seed(10)
    x1, x2 = torch.randn(5, 3, generator=gen), torch.randn(5, 2, generator=gen)
    x2_ours, x2_ref = x2.clone().requires_grad_(), x2.clone().requires_grad_()
    s, t = module(x1, x2_ours)
    p = x1 @ A
    s_ref, t_ref = p * x2_ref + c, torch.tanh(p)
    torch.testing.assert_close(s, s_ref, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(t, t_ref, atol=ATOL, rtol=1e-5)
    (s.sum() * 2 + (t**2).sum()).backward()
    (s_ref.sum() * 2 + (t_ref**2).sum()).backward()
    torch.testing.assert_close(module.A.grad, A.grad, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(module.c.grad, c.grad, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(x2_ours.grad, x2_ref.grad, atol=ATOL, rtol=1e-5)


def test_an_unused_output_leaves_what_only_it_reaches_without_gradient():
    """As torch: the loss reads out_tanh only, so c (which reaches out_sum alone) gets no
    gradient (None, not zeros: momentum or weight decay would move it) and A gets tanh's."""
    model, values = _two_in_two_out()
    module = OnnxModule(model)
    A = torch.tensor(values["A"], requires_grad=True)
    c = torch.tensor(values["c"], requires_grad=True)
    gen = torch.Generator().manual_seed(11)
    x1, x2 = torch.randn(5, 3, generator=gen), torch.randn(5, 2, generator=gen)
    _, t = module(x1, x2)
    t.sum().backward()
    _, t_ref = (x1 @ A) * x2 + c, torch.tanh(x1 @ A)
    t_ref.sum().backward()
    torch.testing.assert_close(module.A.grad, A.grad, atol=ATOL, rtol=1e-5)
    assert c.grad is None
    assert module.c.grad is None
    # and with both outputs used, c gets its gradient
    module.zero_grad()
    s, t = module(x1, x2)
    (s.sum() + t.sum()).backward()
    torch.testing.assert_close(module.c.grad, torch.full((2,), 5.0))


# ---- parameters, modes, export -------------------------------------------------------------------
def test_parameter_names_are_identifiers_mapped_to_onnx_names():
    model, _ = _two_in_two_out()
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    mapping = {"A": "layer.0/weight:0", "c": "1bias"}
    for init in renamed.graph.initializer:
        init.name = mapping[init.name]
    for node in renamed.graph.node:
        node.input[:] = [mapping.get(i, i) for i in node.input]
    module = OnnxModule(renamed)
    names = dict(module.named_parameters())
    assert all(n.isidentifier() for n in names)
    assert sorted(module.onnx_names.values()) == sorted(mapping.values())
    assert set(module.onnx_names) == set(names)


def test_eval_and_no_grad_keep_no_state():
    net = torch_mlp([4, 6, 1], seed=12)
    module = OnnxModule(onnx_from_torch_mlp(net))
    x = torch.randn(8, 4)
    with torch.no_grad():
        out = module(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, net(x).detach(), atol=ATOL, rtol=1e-5)
    module.eval()
    out = module(x)
    assert out.grad_fn is None
    assert all(not fb._pending for fb in module._graphs.values())
    module.train()
    assert module(x).grad_fn is not None


def test_state_dict_round_trip_and_to_device():
    net_a, net_b = torch_mlp([3, 4, 1], seed=13), torch_mlp([3, 4, 1], seed=14)
    a, b = OnnxModule(onnx_from_torch_mlp(net_a)), OnnxModule(onnx_from_torch_mlp(net_b))
    x = torch.randn(5, 3)
    torch.testing.assert_close(b(x), net_b(x), atol=ATOL, rtol=1e-5)
    b.load_state_dict(a.state_dict())  # copies in place
    torch.testing.assert_close(b(x), net_a(x), atol=ATOL, rtol=1e-5)
    with torch.no_grad():  # a new storage for one parameter
        b.W0.data = torch.zeros_like(b.W0)
        net_a[0].weight.zero_()
    torch.testing.assert_close(b(x), net_a(x), atol=ATOL, rtol=1e-5)
    assert b.to("cpu") is b
    assert b.to(torch.float32)(x).shape == (5, 1)


def test_to_onnx_and_save_hold_the_trained_values(tmp_path):
    import onnxruntime

    net = torch_mlp([4, 6, 2], seed=15)
    module = OnnxModule(onnx_from_torch_mlp(net))
    with torch.no_grad():
        module.W0.mul_(2.0)
        net[0].weight.mul_(2.0)
    path = tmp_path / "trained.onnx"
    module.save(path)
    onnx.checker.check_model(onnx.load(path))
    x = torch.randn(7, 4)
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"X": x.numpy()})
    np.testing.assert_allclose(got, net(x).detach().numpy(), atol=ATOL, rtol=1e-5)
    exported = {i.name: numpy_helper.to_array(i) for i in module.to_onnx().graph.initializer}
    np.testing.assert_allclose(exported["W0"], net[0].weight.detach().numpy().T, rtol=1e-6)


def test_deepcopy_and_pickle_rebuild_onnxruntime_objects():
    import pickle

    net = torch_mlp([3, 4, 1], seed=16)
    module = OnnxModule(onnx_from_torch_mlp(net))
    x = torch.randn(6, 3)
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        clone(x).sum().backward()
        torch.testing.assert_close(clone(x), net(x), atol=ATOL, rtol=1e-5)
        assert clone.W0.grad is not None
        assert module.W0.grad is None


def test_a_second_backward_through_one_forward_is_refused():
    module = OnnxModule(onnx_from_torch_mlp(torch_mlp([3, 2], seed=17)))
    out = module(torch.randn(4, 3)).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph is not supported"):
        out.backward()


# ---- zero copy ---------------------------------------------------------------------------------
def test_a_bool_output_comes_back_as_bool_and_the_float_output_trains():
    """Y = X @ W and M = Y > 0: M crosses DLPack as uint8 and must come back as torch.bool,
    non-differentiable, in training and in eval; W's gradient is torch autograd's."""
    w = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["Y"]),
            helper.make_node("Greater", ["Y", "zero"], ["M"]),
        ],
        "bool_out",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("M", TensorProto.BOOL, ["N", 3]),
        ],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    module = OnnxModule(model, weights_to_train=["W"])  # "zero" reaches M only
    x = torch.randn(5, 4)
    ref_w = torch.from_numpy(w).requires_grad_(True)
    ref_y = x @ ref_w
    for mode in ("train", "eval"):
        getattr(module, mode)()
        y, m = module(x)
        assert m.dtype == torch.bool
        assert not m.requires_grad
        torch.testing.assert_close(m, ref_y.detach() > 0)
    module.train()
    y, m = module(x)
    (y * 2).sum().backward()
    (ref_y * 2).sum().backward()
    torch.testing.assert_close(module.W.grad, ref_w.grad, atol=ATOL, rtol=1e-5)


def test_create_graph_gives_first_order_gradients_and_refuses_a_second_order():
    """onnxruntime's gradients carry no graph: with create_graph=True the first-order gradients
    are still torch's, and differentiating them again raises instead of giving zeros."""
    net = torch_mlp([4, 3], seed=23)
    module = OnnxModule(onnx_from_torch_mlp(net))
    x = torch.randn(6, 4)
    (grad,) = torch.autograd.grad(module(x).pow(2).sum(), module.W0, create_graph=True)
    (ref,) = torch.autograd.grad(net(x).pow(2).sum(), net[0].weight)
    torch.testing.assert_close(grad, ref.T, atol=ATOL, rtol=1e-5)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()


def test_tensors_cross_without_copies(monkeypatch):
    t = torch.randn(10, 4)
    ov = ortvalue_from_tensor(t)
    assert ov.data_ptr() == t.data_ptr()
    assert tensor_from_ortvalue(ov).data_ptr() == t.data_ptr()

    net = torch_mlp([4, 3], seed=18)
    module = OnnxModule(onnx_from_torch_mlp(net))
    seen: list[list[int]] = []
    cls = ort_train_core.OrtGradientForwardBackward
    original, original_training = cls.forward, cls.run_forward

    def spy(self, inputs, training=True, weights=None, statistics=None):  # inference
        seen.append([v.data_ptr() for v in (*inputs, *(weights or []))])
        return original(self, inputs, training, weights, statistics)

    def spy_training(self, feeds, keep):  # training: inputs then weights
        seen.append([v.data_ptr() for v in feeds])
        return original_training(self, feeds, keep)

    monkeypatch.setattr(cls, "forward", spy)
    monkeypatch.setattr(cls, "run_forward", spy_training)
    module(t).sum().backward()
    with torch.no_grad():
        module(t)
    expected = [t.data_ptr(), module.W0.data_ptr(), module.b0.data_ptr()]
    assert seen == [expected, expected]


# ---- errors -------------------------------------------------------------------------------------
def test_wrong_input_count_dtype_or_device():
    module = OnnxModule(onnx_from_torch_mlp(torch_mlp([3, 2], seed=19)))
    with pytest.raises(TypeError, match=r"takes 1 tensor\(s\) \['X'\], got 2"):
        module(torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(TypeError, match=r"must be torch\.float32, got torch\.float64"):
        module(torch.randn(2, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"must be a torch\.Tensor"):
        module(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(TypeError, match="ModelProto, serialized bytes or a path"):
        OnnxModule(42)


def test_a_graph_without_gradient_is_refused():
    """The weight reaches the output only through ai.onnx.ml LinearRegressor (no gradient)."""
    values = numpy_helper.from_array(np.ones((3, 3), dtype=np.float32), "coef")
    node = helper.make_node(
        "LinearRegressor", ["m"], ["out"], domain="ai.onnx.ml", coefficients=[1.0, 2.0, 3.0]
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "coef"], ["m"]), node],
        "ml",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 1])],
        [values],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    with pytest.raises(GraphNotDifferentiableError, match="LinearRegressor"):
        OnnxModule(model)


def test_coefficients_in_attributes_leave_nothing_to_train_and_say_so():
    """skl2onnx's default LinearRegression graph: the coefficients are attributes of ai.onnx.ml
    LinearRegressor, so no initializer becomes a parameter; the module refuses at construction
    (naming the operator and the conversion that fixes it) instead of giving outputs that torch
    later finds without a gradient."""
    node = helper.make_node(
        "LinearRegressor", ["X"], ["out"], domain="ai.onnx.ml", coefficients=[1.0, 2.0, 3.0], intercepts=[0.5]
    )
    graph = helper.make_graph(
        [node],
        "ml",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 1])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    with pytest.raises(
        GraphNotDifferentiableError, match=r"no parameter to train.*LinearRegressor.*black_op"
    ):
        OnnxModule(model)


def _batchnorm_net_and_graph() -> tuple[nn.Sequential, onnx.ModelProto]:
    """Linear -> BatchNorm1d -> ReLU -> Linear, and the same as ONNX with a second, bool output
    M = Y > thr (a float initializer used only by the comparison)."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 2.0)
        net[1].bias.normal_()
        net[1].running_mean.normal_()
        net[1].running_var.uniform_(0.5, 2.0)
    bn = net[1]
    values = {
        "W0": net[0].weight.detach().T,
        "b0": net[0].bias.detach(),
        "scale": bn.weight.detach(),
        "shift": bn.bias.detach(),
        "running_mean": bn.running_mean.detach(),
        "running_var": bn.running_var.detach(),
        "W1": net[3].weight.detach().T,
        "b1": net[3].bias.detach(),
        "thr": torch.tensor(0.25),
    }
    nodes = [
        helper.make_node("MatMul", ["X", "W0"], ["m0"]),
        helper.make_node("Add", ["m0", "b0"], ["z0"]),
        helper.make_node(
            "BatchNormalization",
            ["z0", "scale", "shift", "running_mean", "running_var"],
            ["n0"],
            epsilon=bn.eps,
        ),
        helper.make_node("Relu", ["n0"], ["a0"]),
        helper.make_node("MatMul", ["a0", "W1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["Y"]),
        helper.make_node("Greater", ["Y", "thr"], ["M"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2]),
            helper.make_tensor_value_info("M", TensorProto.BOOL, ["N", 2]),
        ],
        [numpy_helper.from_array(v.numpy().copy(), k) for k, v in values.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return net, model


def test_batchnorm_statistics_and_a_threshold_are_not_parameters():
    """By default the parameters are the initializers with a gradient: not BatchNormalization's
    running statistics (onnxruntime gives them none) nor a threshold compared with. In train
    mode the batch is normalised with its own statistics and the gradients match torch's
    BatchNorm1d in train mode; in eval mode the running statistics, as torch's."""
    net, model = _batchnorm_net_and_graph()
    module = OnnxModule(model)
    assert list(module.onnx_names.values()) == ["W0", "b0", "scale", "shift", "W1", "b1"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 4, generator=gen)
    target = torch.randn(12, 2, generator=gen)
    module.eval()
    net.eval()
    with torch.no_grad():
        y, m = module(x)
        torch.testing.assert_close(y, net(x), atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(m, net(x) > 0.25)
    module.train()
    net.train()
    y, m = module(x)
    torch.testing.assert_close(y, net(x), atol=ATOL, rtol=1e-5)
    assert m.dtype == torch.bool
    assert not m.requires_grad
    nn.functional.mse_loss(y, target).backward()
    nn.functional.mse_loss(net(x), target).backward()
    expected = {
        "W0": net[0].weight.grad.T,
        "b0": net[0].bias.grad,
        "scale": net[1].weight.grad,
        "shift": net[1].bias.grad,
        "W1": net[3].weight.grad.T,
        "b1": net[3].bias.grad,
    }
    for name, grad in expected.items():
        torch.testing.assert_close(getattr(module, name).grad, grad, atol=ATOL, rtol=1e-4, msg=name)


def test_import_without_the_training_build_says_how_to_install_it():
    code = textwrap.dedent(
        """
        import json, sys
        sys.modules['onnxruntime'] = None
        try:
            import ort_train_torch
        except ImportError as exc:
            print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
        else:
            print(json.dumps({"type": None}))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["type"] == "TrainingRuntimeError"
    assert "pip install" in out["message"]


# ---- CUDA ----------------------------------------------------------------------------------------
@pytest.mark.cuda
def test_cuda_gradients_match_torch_autograd():
    """On the GPU, against the same torch network on the GPU: outputs, parameter and input
    gradients; eval() runs the inference session there too."""
    net = torch_mlp([6, 8, 2], seed=20).cuda()
    module = OnnxModule(onnx_from_torch_mlp(net)).to("cuda")
    x = torch.randn(9, 6, device="cuda")
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = module(x_ours)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out, net(x), atol=ATOL, rtol=1e-5)
    out.pow(2).sum().backward()
    net(x_ref).pow(2).sum().backward()
    _assert_grads_match(module, net)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, atol=1e-5, rtol=1e-4)
    module.eval()
    torch.testing.assert_close(module(x), net(x), atol=ATOL, rtol=1e-5)


@pytest.mark.cuda
def test_cuda_tensors_cross_without_copies():
    t = torch.randn(10, 4, device="cuda")
    ov = ortvalue_from_tensor(t)
    assert ov.data_ptr() == t.data_ptr()
    back = tensor_from_ortvalue(ov)
    assert back.device == t.device
    assert back.data_ptr() == t.data_ptr()
