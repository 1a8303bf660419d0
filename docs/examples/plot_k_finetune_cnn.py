"""
.. _example-finetune-cnn:

Fine-tuning a CNN exported from torch
=====================================

A small residual CNN (convolutions, BatchNorm, a skip connection, global average pooling, a
linear head) is trained in torch on half of scikit-learn's digits (classes 0 to 4), exported to
ONNX, and fine-tuned on all ten digits by onnxruntime, without torch: first the head alone (a
frozen backbone), then every layer, BatchNorm's running statistics updated as torch would. The
trained graph is written to a file; loaded back into the torch network, its weights give
torch's ``eval()`` the same predictions. See :doc:`/exported_models` for the export settings.
"""

import io
import os
import tempfile
import warnings

import matplotlib.pyplot as plt
import numpy as np
import onnx
import onnxruntime
import torch
from onnx import numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from ort_train_core import OrtGradientOptimizer, add_loss_output

torch.manual_seed(0)
digits = load_digits()
X = (digits.images / 16.0).astype(np.float32)[:, None]  # images [N, 1, 8, 8]
y = digits.target.astype(np.int64)
X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.3, random_state=0, stratify=y
)

# %%
# The network: a resnet-style block written in torch (torchvision's models are the same
# pattern at a larger scale).


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = (
            nn.Conv2d(c, c, 3, padding=1, bias=False),
            nn.BatchNorm2d(c),
        )
        self.conv2, self.bn2 = (
            nn.Conv2d(c, c, 3, padding=1, bias=False),
            nn.BatchNorm2d(c),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(h)))


class SmallResNet(nn.Module):
    def __init__(self, n_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.block = Block(16)
        self.fc = nn.Linear(16, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.block(self.stem(x)).mean(dim=(2, 3)))


net = SmallResNet()

# %%
# "Pretraining" in torch on classes 0 to 4 only.

first = y_train < 5
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
images, labels = torch.from_numpy(X_train[first]), torch.from_numpy(y_train[first])
net.train()
for _ in range(5):
    for s in range(0, len(labels), 32):
        opt.zero_grad()
        nn.functional.cross_entropy(
            net(images[s : s + 32]), labels[s : s + 32]
        ).backward()
        opt.step()

# %%
# The export that keeps every parameter trainable: the TorchScript exporter in training mode,
# without constant folding (which would fold BatchNorm into the convolutions), a free batch
# dimension.

buffer = io.BytesIO()
with warnings.catch_warnings():  # torch 2.13 marks the TorchScript exporter deprecated
    warnings.simplefilter("ignore")
    torch.onnx.export(
        net,
        (torch.from_numpy(X_train[:2]),),
        buffer,
        dynamo=False,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        input_names=["images"],
        output_names=["logits"],
        dynamic_axes={"images": {0: "N"}, "logits": {0: "N"}},
        opset_version=18,
    )
exported = onnx.load_from_string(buffer.getvalue())
loss_model = add_loss_output(exported, score_name="cross_entropy")


def accuracy(model: onnx.ModelProto) -> float:
    sess = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    logits = sess.run(None, {"images": X_test})[0]
    return float((logits.argmax(axis=1) == y_test).mean())


print(f"exported, test accuracy on all ten digits: {accuracy(exported):.3f}")

# %%
# Phase 1: the head alone (``weights_to_train``), the backbone frozen.

params = dict(max_iter=15, batch_size=32, learning_rate=0.05, random_state=0)
head = OrtGradientOptimizer(
    loss_model, weights_to_train=["fc.weight", "fc.bias"], **params
)
head.fit(X_train, y_train)
print(f"head fine-tuned: test accuracy {accuracy(head.get_trained_onnx()):.3f}")

# %%
# Phase 2: every layer, from phase 1's head. The state of a trainer holds its trained weights
# and BatchNorm's running statistics: written into the loss graph, they start phase 2.

start = onnx.ModelProto()
start.CopyFrom(loss_model)
state = head.get_state()
for init in start.graph.initializer:
    if init.name in state:
        init.CopyFrom(numpy_helper.from_array(state[init.name], init.name))
full = OrtGradientOptimizer(start, **params).fit(X_train, y_train)
trained = full.get_trained_onnx()
print(f"all layers fine-tuned: test accuracy {accuracy(trained):.3f}")

fig, ax = plt.subplots(figsize=(6, 3.5))
epochs = np.arange(1, params["max_iter"] + 1)
ax.plot(epochs, head.train_losses_, label="phase 1: head only")
ax.plot(epochs + params["max_iter"], full.train_losses_, label="phase 2: all layers")
ax.set_xlabel("epoch")
ax.set_ylabel("training cross-entropy")
ax.set_title("Fine-tuning an exported CNN with onnxruntime")
ax.legend()
fig.tight_layout()

# %%
# The trained graph on disk, reloaded, and its weights back in the torch network: torch's
# ``eval()`` (running statistics) gives the same logits.

path = os.path.join(tempfile.mkdtemp(), "finetuned_cnn.onnx")
onnx.save(trained, path)
reloaded = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
logits = reloaded.run(None, {"images": X_test})[0]

weights = {
    i.name: torch.from_numpy(numpy_helper.to_array(i).copy())
    for i in onnx.load(path).graph.initializer
}
net.load_state_dict(
    {k: weights[k] for k in net.state_dict() if k in weights}, strict=False
)
net.eval()
with torch.no_grad():
    expected = net(torch.from_numpy(X_test)).numpy()
gap = np.abs(logits - expected).max()
print(
    f"wrote {os.path.basename(path)}; largest difference with torch eval(): {gap:.2e}"
)
