"""
.. _example-gpu:

Train on a GPU
==============

The same trainers take ``device='cuda'`` (or ``'cuda:N'``): the data goes to the GPU once when
the fit starts (a shuffled epoch gathers its batches there), weights and optimizer states stay
there between steps, and the losses come back to the host once per epoch. That needs
``pip install "./packages/ort-train-core[gpu]"`` (from a clone; onnxruntime-gpu and NVIDIA's
CUDA 13 / cuDNN 9 wheels, the ``onnx`` backend; or the older ``[cuda]``: onnxruntime-training's
CUDA build and the CUDA 11.8 / cuDNN 8 wheels) and a GPU; this script asks
:func:`~ort_train_core.check_device` and falls back to the CPU otherwise (which is what happens
while the documentation builds on a machine without a GPU).
"""

import textwrap
import time

import matplotlib.pyplot as plt
import numpy as np
import onnxruntime
from skl2onnx import to_onnx
from sklearn.datasets import load_diabetes
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from ort_train_core import (
    CudaUnavailableError,
    LearningRateAdam,
    OrtGradientOptimizer,
    add_loss_output,
    check_device,
)

print("onnxruntime offers", onnxruntime.get_available_providers())
try:
    device = check_device("cuda")  # a CUDA build, the driver, a GPU, its CUDA libraries
    print("training on", device)
except (ValueError, CudaUnavailableError) as exc:
    device = "cpu"
    print(textwrap.fill(f"this example runs on the CPU: {exc}", 88))

# %%
# An MLP whose initial weights come from scikit-learn (one iteration), converted to ONNX.

X, y = load_diabetes(return_X_y=True)
X = StandardScaler().fit_transform(X).astype(np.float32)
y = ((y - y.mean()) / y.std()).astype(np.float32)
init = MLPRegressor(hidden_layer_sizes=(32,), max_iter=1, random_state=0)
init.partial_fit(X, y)
onx_loss = add_loss_output(to_onnx(init, X[:1]))

# %%
# Training with Adam, on the device chosen above. The first fit builds the graphs and the
# sessions; the second one continues (``warm_start=True``) and shows the steady state.

trainer = OrtGradientOptimizer(
    onx_loss,
    max_iter=40,
    batch_size=32,
    learning_rate=LearningRateAdam(eta0=0.005),
    device=device,
    warm_start=True,
    random_state=0,
)
begin = time.perf_counter()
trainer.fit(X, y)
first = time.perf_counter() - begin
begin = time.perf_counter()
trainer.fit(X, y)
second = time.perf_counter() - begin
steps = 40 * int(np.ceil(len(X) / 32))
print(
    f"first fit {first * 1000:.0f} ms (graphs and sessions built), "
    f"second fit {second * 1000:.0f} ms"
)
print(f"{second / steps * 1e6:.1f} us per step on {device}")

# %%
# The loss over both fits.

fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(np.arange(1, trainer.n_iter_ + 1), trainer.train_losses_)
ax.axvline(40.5, color="gray", ls="--", lw=1)
ax.set_xlabel("epoch")
ax.set_ylabel("training loss (mean squared error)")
ax.set_yscale("log")
ax.set_title(f"MLP trained with Adam on {device}")
fig.tight_layout()
