"""
.. _example-torch-module:

An ONNX graph inside a torch model
==================================

:class:`ort_train_torch.OnnxModule` wraps an ONNX graph as a ``torch.nn.Module``: its
initializers become ``nn.Parameter``\\ s, onnxruntime-training computes its forward and its
backward (the gradients of its inputs and of its weights), and any torch optimiser updates
them. Here a hidden layer written in ONNX sits between two ``torch.nn.Linear`` layers; the
same network written in torch alone, from the same weights, follows the same path.
"""

import copy

import matplotlib.pyplot as plt
import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from sklearn.datasets import load_diabetes
from sklearn.preprocessing import StandardScaler

from ort_train_torch import OnnxModule

torch.manual_seed(0)
X, y = load_diabetes(return_X_y=True)
X = torch.tensor(StandardScaler().fit_transform(X), dtype=torch.float32)
y = torch.tensor((y - y.mean()) / y.std(), dtype=torch.float32).reshape(-1, 1)

# %%
# The ONNX block: ``H = relu(X @ W + b)``, 16 inputs, 8 outputs.

rng = np.random.default_rng(0)
W = (rng.standard_normal((16, 8)) / 4).astype(np.float32)
b = np.zeros(8, dtype=np.float32)
graph = helper.make_graph(
    [
        helper.make_node("MatMul", ["X", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["z"]),
        helper.make_node("Relu", ["z"], ["H"]),
    ],
    "hidden_layer",
    [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", 16])],
    [helper.make_tensor_value_info("H", onnx.TensorProto.FLOAT, ["N", 8])],
    [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")],
)
block_onnx = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
block_onnx.ir_version = 8

block = OnnxModule(block_onnx)
print(block)
print([(name, tuple(p.shape)) for name, p in block.named_parameters()])

# %%
# The torch model around it, and its twin in plain torch (same weights).

first, last = torch.nn.Linear(10, 16), torch.nn.Linear(8, 1)
net = torch.nn.Sequential(first, block, last)


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(torch.from_numpy(W.copy()))
        self.b = torch.nn.Parameter(torch.from_numpy(b.copy()))

    def forward(self, x):
        return torch.relu(x @ self.W + self.b)


twin = torch.nn.Sequential(copy.deepcopy(first), TorchBlock(), copy.deepcopy(last))


def train(model, epochs=30, batch=32):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
    losses = []
    for _ in range(epochs):
        total = 0.0
        for s in range(0, len(X), batch):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(
                model(X[s : s + batch]), y[s : s + batch]
            )
            loss.backward()
            optimizer.step()
            total += loss.item() * len(X[s : s + batch])
        losses.append(total / len(X))
    return losses


losses_onnx = train(net)
losses_torch = train(twin)
print("last epoch:", round(losses_onnx[-1], 6), round(losses_torch[-1], 6))
print("largest weight gap:", (block.W - twin[1].W).abs().max().item())

# %%
# ``to_onnx`` gives the block with its trained weights, for any onnxruntime session.

trained = block.to_onnx()
print({i.name: numpy_helper.to_array(i).shape for i in trained.graph.initializer})

fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(np.arange(1, 31), losses_onnx, label="Linear -> OnnxModule -> Linear")
ax.plot(np.arange(1, 31), losses_torch, "--", label="the same network in torch")
ax.set_xlabel("epoch")
ax.set_ylabel("training loss (mean squared error)")
ax.set_yscale("log")
ax.set_title("torch.optim.Adam through onnxruntime-training")
ax.legend()
fig.tight_layout()
