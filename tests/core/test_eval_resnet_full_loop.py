"""A resnet18-style network exported by the TorchScript exporter in eval mode (issue 17, item 9).

Its gradient graph crashed the process (segmentation fault): onnxruntime-training's CPU
MaxPoolGrad sizes its output from the shape recorded for it when the session is created, and
after the input's run-time Reshape that shape is unknown, so the kernel wrote out of bounds.
The full loop now writes those MaxPoolGrad nodes as a scatter of standard operators. Every run
here happens in a subprocess, so that a regression fails the test instead of killing pytest.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

torch = pytest.importorskip("torch")
nn = torch.nn

from ort_train_core.graph import MAX_IR_VERSION  # noqa: E402

CHANNELS, SIDE, BATCH, STEPS, LR = 3, 16, 4, 3, 0.01


class BasicBlock(nn.Module):
    """resnet18's block: conv-bn-relu-conv-bn plus the shortcut (conv1x1-bn when the shape
    changes), relu; ``folded``: each conv carries a bias and no BatchNorm follows (the network
    an eval-mode export describes)."""

    def __init__(self, cin: int, cout: int, stride: int, folded: bool) -> None:
        super().__init__()

        def norm(c: int) -> nn.Module:
            return nn.Identity() if folded else nn.BatchNorm2d(c)

        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=folded), norm(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=folded), norm(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=folded), norm(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNetStyle(nn.Module):
    """Stem conv-bn-relu-maxpool, two stages of basic blocks (the second downsampling), adaptive
    average pool, flatten, fc; rows of CHANNELS x SIDE x SIDE values reshaped in the graph (the
    core trainers' fit takes 2-D inputs)."""

    def __init__(self, folded: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(CHANNELS, 8, 3, 1, 1, bias=folded)
        self.bn1 = nn.Identity() if folded else nn.BatchNorm2d(8)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(8, 8, 1, folded), BasicBlock(8, 8, 1, folded))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2, folded), BasicBlock(16, 16, 1, folded))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x.reshape(x.shape[0], CHANNELS, SIDE, SIDE)))))
        return self.fc(torch.flatten(self.avgpool(self.layer2(self.layer1(x))), 1))


def _eval_export(net: nn.Module, example: torch.Tensor) -> onnx.ModelProto:
    """The TorchScript export in eval mode: BatchNorm folded into the convolutions. The
    statistics and affine parameters are drawn first: fresh ones fold into equal zero biases,
    which the exporter merges into one tensor (trained tied, unlike torch's)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for bn in (m for m in net.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.5, 0.5, generator=gen)
            bn.running_var.uniform_(0.5, 2.0, generator=gen)
            bn.weight.uniform_(0.5, 1.5, generator=gen)
            bn.bias.uniform_(-0.5, 0.5, generator=gen)
    f = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net.eval(),
            (example,),
            f,
            dynamo=False,
            training=torch.onnx.TrainingMode.EVAL,
            opset_version=17,
            input_names=["X"],
            output_names=["Y"],
            dynamic_axes={"X": {0: "N"}, "Y": {0: "N"}},
        )
    model = onnx.load_from_string(f.getvalue())
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


def _folded_twin(model: onnx.ModelProto) -> nn.Module:
    """The network the export describes, in torch: each Conv node's weight and bias (BatchNorm
    folded in), in the order the convolutions run, and the fc."""
    twin = ResNetStyle(folded=True)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    values.update(
        (n.output[0], numpy_helper.to_array(n.attribute[0].t))
        for n in model.graph.node
        if n.op_type == "Constant"
    )
    called: list[nn.Conv2d] = []
    hooks = [
        m.register_forward_hook(lambda m, i, o: called.append(m))
        for m in twin.modules()
        if isinstance(m, nn.Conv2d)
    ]
    twin(torch.zeros(1, CHANNELS * SIDE * SIDE))
    for hook in hooks:
        hook.remove()
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == len(called)
    assert all(len(n.input) == 3 for n in convs)
    (gemm,) = [n for n in model.graph.node if n.op_type == "Gemm"]
    with torch.no_grad():
        for module, node in [*zip(called, convs), (twin.fc, gemm)]:
            module.weight.copy_(torch.from_numpy(values[node.input[1]].copy()))
            module.bias.copy_(torch.from_numpy(values[node.input[2]].copy()))
    return twin


def _torch_sgd(net: nn.Module, X: np.ndarray, y: np.ndarray) -> list[float]:
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    losses = []
    for start in range(0, len(X), BATCH):
        xb, yb = torch.from_numpy(X[start : start + BATCH]), torch.from_numpy(y[start : start + BATCH])
        loss = torch.nn.functional.mse_loss(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


#: the full loop's SGD steps, in a child process (a crash is its return code, not pytest's death)
_TRAIN = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np, onnx
    from ort_train_core import Callback, OrtGradientOptimizer, add_loss_output

    warnings.simplefilter("ignore")  # the folded-BatchNorm and shared-initializer warnings
    folder = sys.argv[1]
    data = np.load(folder + "/data.npz")
    losses = []

    class Steps(Callback):
        def on_batch_end(self, trainer, epoch, batch, loss):
            losses.append(loss)

    model = add_loss_output(onnx.load(folder + "/model.onnx"))
    common = dict(learning_rate=float(sys.argv[2]), batch_size=int(sys.argv[3]), max_iter=1)
    OrtGradientOptimizer(model, shuffle=False, callbacks=[Steps()], **common).fit(data["X"], data["y"])
    json.dump(losses, open(folder + "/losses.json", "w"))
    """
)


def test_eval_mode_resnet_trains_in_the_full_loop_as_torch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(STEPS * BATCH, CHANNELS * SIDE * SIDE)).astype(np.float32)
    y = rng.normal(size=(STEPS * BATCH, 1)).astype(np.float32)
    model = _eval_export(ResNetStyle(), torch.from_numpy(X[:BATCH]))
    ops = {n.op_type for n in model.graph.node}
    assert "BatchNormalization" not in ops
    assert {"MaxPool", "Reshape", "Flatten"} <= ops
    onnx.save(model, str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "data.npz", X=X, y=y)

    args = [str(tmp_path), str(LR), str(BATCH)]
    done = subprocess.run([sys.executable, "-c", _TRAIN, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (
        f"the full loop's process ended with {done.returncode}: {done.stderr[-2000:]}"
    )
    losses = json.loads((tmp_path / "losses.json").read_text())
    np.testing.assert_allclose(losses, _torch_sgd(_folded_twin(model), X, y), rtol=1e-4)
