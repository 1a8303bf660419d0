"""
.. _example-export-training-step:

Training with nothing but onnxruntime: an exported training step
================================================================

:func:`~ort_train_core.export_training_step` writes one training step of a model (forward,
loss, backward, optimizer update, BatchNorm's running statistics) as a standard ONNX graph in
default-domain operators. Any onnxruntime runs it, an inference-only one included: the loop
that trains is a few lines of numpy around ``onnxruntime.InferenceSession``, and needs none of
our code.

A small CNN with BatchNorm is trained in torch on half of scikit-learn's digits (classes 0 to
4), exported to ONNX, and fine-tuned on all ten digits by the exported step. The trained state
then goes back into the model as an inference graph
(:func:`~ort_train_core.model_from_step_state`). The same step file trains in C++, Node.js or
the browser: see :doc:`/outside_python`.
"""

import io
import os
import tempfile
import time
import warnings
from pprint import pprint

import matplotlib.pyplot as plt
import numpy as np
import onnx
import onnxruntime
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from ort_train_core import (
    LearningRateSGDNesterov,
    add_loss_output,
    export_training_step,
    model_from_step_state,
    step_initial_state,
    step_signature,
)

torch.manual_seed(0)
digits = load_digits()
X = (digits.images / 16.0).astype(np.float32)[:, None]  # images [N, 1, 8, 8]
y = digits.target.astype(np.int64)
X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.3, random_state=0, stratify=y
)

# %%
# A small CNN with BatchNorm, "pretrained" in torch on classes 0 to 4 only.

net = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1, bias=False),
    nn.BatchNorm2d(8),
    nn.ReLU(),
    nn.Conv2d(8, 16, 3, padding=1, bias=False),
    nn.BatchNorm2d(16),
    nn.ReLU(),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Linear(16, 10),
)
first = y_train < 5
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
images, labels = torch.from_numpy(X_train[first]), torch.from_numpy(y_train[first])
net.train()
for _ in range(3):
    for s in range(0, len(labels), 32):
        opt.zero_grad()
        nn.functional.cross_entropy(
            net(images[s : s + 32]), labels[s : s + 32]
        ).backward()
        opt.step()

# %%
# The export that keeps every parameter trainable (see :doc:`/exported_models`): training
# mode, no constant folding, a free batch dimension.

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
model = onnx.load_from_string(buffer.getvalue())

# %%
# The training step: cross-entropy on the logits, SGD with momentum, 32 rows a step (the batch
# size is fixed in the graph). The file is all a runtime needs. The command line writes the same
# step from the model's file, with its initial state as an ``.npz`` beside it::
#
#     ort-train export-step cnn.onnx --loss cross_entropy --optimizer momentum --lr 0.05 \
#         --batch-size 32 --out cnn_training_step.onnx

batch_size = 32
step = export_training_step(
    add_loss_output(model, score_name="cross_entropy"),
    optimizer=LearningRateSGDNesterov(
        eta0=0.05, learning_rate="constant", nesterov=False
    ),
    batch_size=batch_size,
)
step_path = os.path.join(tempfile.mkdtemp(), "cnn_training_step.onnx")
onnx.save(step, step_path)
sig = step_signature(step)
opset = step.opset_import[0].version
print(
    f"wrote {os.path.basename(step_path)}: {len(step.graph.node)} nodes, opset {opset}"
)
print("inputs:")
pprint([i.name for i in step.graph.input], width=88, compact=True)
print("outputs:")
pprint([o.name for o in step.graph.output], width=88, compact=True)
print(
    f"data inputs {sig.data}; "
    f"state inputs: {len(sig.state)} (weights, velocities, statistics)"
)

# %%
# The loop: feed a batch and its labels, then feed each output ``<name>_new`` back as the input
# ``<name>``. The first step needs only data: every other input has its initial value as a
# default in the file.

options = onnxruntime.SessionOptions()
options.log_severity_level = (
    3  # onnxruntime notes that those inputs have defaults: by design
)
sess = onnxruntime.InferenceSession(
    step_path, options, providers=["CPUExecutionProvider"]
)
names = [o.name.removesuffix("_new") for o in sess.get_outputs()]
rng = np.random.default_rng(0)
state, epoch_losses = {}, []
start = time.perf_counter()
for epoch in range(10):
    order, losses = rng.permutation(len(y_train)), []
    for s in range(0, len(order) - batch_size + 1, batch_size):  # whole batches only
        rows = order[s : s + batch_size]
        loss, *new = sess.run(
            None, {"images": X_train[rows], "label": y_train[rows], **state}
        )
        state = dict(zip(names[1:], new))
        losses.append(float(loss))
    epoch_losses.append(np.mean(losses))
    print(f"epoch {epoch + 1:2d}: mean training loss {epoch_losses[-1]:.4f}")
elapsed = time.perf_counter() - start
n_steps = 10 * (len(y_train) // batch_size)
print(f"{n_steps} steps in {elapsed:.2f} s ({1000 * elapsed / n_steps:.2f} ms a step)")

# %%
# The trained model: the state's weights and running statistics written into the exported
# graph, in inference form (BatchNorm normalises with its running statistics, as torch's
# ``eval()``), and its test accuracy against the model's before the fine-tuning.


def accuracy(m: onnx.ModelProto) -> float:
    infer = onnxruntime.InferenceSession(
        m.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    logits = infer.run(None, {"images": X_test})[0]
    return float((logits.argmax(axis=1) == y_test).mean())


trained = model_from_step_state(model, state)
before = model_from_step_state(
    model, step_initial_state(step)
)  # the state before the first step
print(
    f"test accuracy on all ten digits: before {accuracy(before):.3f}, "
    f"after {accuracy(trained):.3f}"
)

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(np.arange(1, len(epoch_losses) + 1), epoch_losses, marker="o")
ax.set_xlabel("epoch")
ax.set_ylabel("training cross-entropy")
ax.set_title("A CNN trained by its exported step in onnxruntime")
fig.tight_layout()
