"""A training batch that leaves a BatchNormalization node one value per channel is refused, as
torch refuses it ("Expected more than 1 value per channel when training"), before any step:
onnxruntime would write a huge negative running variance (the unbiased correction divides by
n - 1 = 0) and later predictions would be NaN.

The rule is torch's, checked against torch itself: the node's input [N, C, *spatial] may not
have N * prod(spatial) == 1; a 1-row image batch with H x W > 1 is fine.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

torch = pytest.importorskip("torch")
nn = torch.nn

from batchnorm_support import BatchNormMLP, FlatConvNet, batchnorm_data, export_training  # noqa: E402
from ort_train_core import (  # noqa: E402
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
)
from ort_train_core._batchnorm import single_value_channels  # noqa: E402

ROUTES = ["full", "partial"]


def _torch_refuses(shape: tuple[int, ...]) -> bool:
    """Whether torch's training-mode batch norm refuses an input of ``shape``."""
    c = shape[1]
    try:
        torch.nn.functional.batch_norm(
            torch.ones(shape), torch.zeros(c), torch.ones(c), training=True, momentum=0.1
        )
    except ValueError as exc:
        return "Expected more than 1 value per channel" in str(exc)
    return False


def _batch_norm_graph(rank: int, reshape_input: bool = False) -> onnx.ModelProto:
    """One training-mode BatchNormalization of 3 channels on an input of ``rank`` with no
    static dimension but C; ``reshape_input``: X [N, 3 * k] reshaped by a shape input, which
    shape inference cannot follow."""
    dims: list[int | str | None] = ["N", 3, *[f"S{k}" for k in range(rank - 2)]]
    stats = [
        helper.make_tensor(name, TensorProto.FLOAT, [3], [value] * 3)
        for name, value in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0))
    ]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, dims)]
    nodes = []
    x = "X"
    if reshape_input:
        inputs = [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", None]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [rank]),
        ]
        nodes.append(helper.make_node("Reshape", ["X", "shape"], ["X4"]))
        x = "X4"
    nodes.append(
        helper.make_node(
            "BatchNormalization",
            [x, "scale", "bias", "mean", "var"],
            ["Y", "rm", "rv"],
            name="bn",
            training_mode=1,
        )
    )
    graph = helper.make_graph(
        nodes, "bn", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], stats
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(
    "shape",
    [
        (1, 3),
        (2, 3),
        (1, 3, 1),
        (1, 3, 2),
        (2, 3, 1),
        (1, 3, 1, 1),
        (1, 3, 2, 1),
        (1, 3, 1, 1, 1),
        (1, 3, 1, 2, 1),
    ],
)
def test_the_rule_is_torch_s(shape: tuple[int, ...]) -> None:
    """Static shapes, and shapes only a run can tell (a Reshape by a shape input)."""
    expected = _torch_refuses(shape)
    model = _batch_norm_graph(len(shape))
    found = single_value_channels(model, ["mean", "var"], {"X": shape})
    assert bool(found) == expected
    reshaped = _batch_norm_graph(len(shape), reshape_input=True)
    flat = (shape[0], int(np.prod(shape[1:])))
    feeds = {"X": np.ones(flat, np.float32), "shape": np.array(shape, np.int64)}
    found = single_value_channels(
        reshaped, ["mean", "var"], {"X": flat, "shape": (len(shape),)}, lambda: feeds
    )
    assert bool(found) == expected
    if expected:
        assert found == [f"'bn' (input {list(shape)})"]


@pytest.fixture(scope="module")
def mlp_export() -> onnx.ModelProto:
    torch.manual_seed(0)
    X, _ = batchnorm_data()
    return export_training(BatchNormMLP(), torch.from_numpy(X[:8]))


def _trainer(route: str, model: onnx.ModelProto, batch_size: int):
    common = dict(learning_rate=0.01, batch_size=batch_size, max_iter=2, shuffle=False)
    if route == "full":
        return OrtGradientOptimizer(add_loss_output(model), **common)
    return OrtGradientForwardBackwardOptimizer(model, **common)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("n_rows", "batch_size", "words"),
    [
        (11, 5, "batch_size=5 leaves a last batch of 1 row (11 rows)"),
        (4, 1, "batch_size=1 gives batches of 1 row"),
        (1, 5, "the training data has a single row"),
    ],
)
def test_a_one_row_batch_is_refused_before_any_step(
    route: str, n_rows: int, batch_size: int, words: str, mlp_export
) -> None:
    """torch refuses the 1-row batch; the trainer refuses the fit, saying why and what to
    change, and leaves the fitted weights, running statistics and history as they were."""
    X, y = batchnorm_data()
    net = BatchNormMLP().train()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        net(torch.from_numpy(X[:1]))
    trainer = _trainer(route, mlp_export, batch_size=5).fit(X[:10], y[:10])
    state, losses = trainer.get_state(), list(trainer.train_losses_)
    trainer.set_params(batch_size=batch_size)
    with pytest.raises(ValueError, match="BatchNormalization in training mode") as info:
        trainer.fit(X[:n_rows], y[:n_rows])
    message = str(info.value)
    assert words in message
    assert "BatchNormalization in training mode needs more than 1 value per channel" in message
    assert "choose a batch_size" in message or "train on 2 rows or more" in message
    after = trainer.get_state()
    assert after.keys() == state.keys()
    for name, value in state.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert trainer.train_losses_ == losses


@pytest.mark.parametrize("route", ROUTES)
def test_the_message_names_batch_sizes_that_work(route: str, mlp_export) -> None:
    X, y = batchnorm_data()
    with pytest.raises(ValueError, match=r"e\.g\. 4 or 6"):
        _trainer(route, mlp_export, batch_size=5).fit(X[:11], y[:11])
    trainer = _trainer(route, mlp_export, batch_size=4).fit(X[:11], y[:11])  # 4, 4, 3 rows
    assert all(np.isfinite(v).all() and (v >= 0).all() for k, v in trainer.get_state().items() if "var" in k)


@pytest.mark.parametrize("route", ROUTES)
def test_a_one_row_image_batch_trains(route: str) -> None:
    """BatchNorm2d on [1, 4, 6, 6]: 36 values per channel, which torch accepts too."""
    torch.manual_seed(0)
    X, y = batchnorm_data(n_features=72)
    net = FlatConvNet()
    model = export_training(copy.deepcopy(net), torch.from_numpy(X[:4]))
    net.train()(torch.from_numpy(X[:1]))  # torch: no error
    trainer = _trainer(route, model, batch_size=5).fit(X[:11], y[:11])
    running = [v for k, v in trainer.get_state().items() if "running_var" in k]
    assert running
    assert all(np.isfinite(v).all() and (v > 0).all() for v in running)


def test_a_one_row_training_forward_is_refused(mlp_export) -> None:
    """OrtGradientForwardBackward (what the torch module calls): a 1-row training forward is
    refused and changes no statistic; 2 rows, or 1 row in inference, run."""
    X, _ = batchnorm_data()
    fb = OrtGradientForwardBackward(mlp_export)
    before = fb.get_statistics()
    with pytest.raises(ValueError, match="a training forward of X \\[1, 5\\]: BatchNormalization"):
        fb.forward([X[:1]], training=True)
    for name, value in fb.get_statistics().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    (out,) = fb.forward([X[:1]], training=False)
    assert np.isfinite(out.numpy()).all()
    fb.forward([X[:2]], training=True)
    fb.backward([np.ones((2, 1), np.float32)])
    assert all((v > 0).all() for k, v in fb.get_statistics().items() if "var" in k)


def test_a_one_row_image_forward_runs() -> None:
    torch.manual_seed(0)
    X, _ = batchnorm_data(n_features=72)
    fb = OrtGradientForwardBackward(export_training(FlatConvNet(), torch.from_numpy(X[:4])))
    (out,) = fb.forward([X[:1]], training=True)
    fb.backward([np.ones((1, 1), np.float32)])
    assert np.isfinite(out.numpy()).all()
    assert all((v > 0).all() for k, v in fb.get_statistics().items() if "var" in k)
