"""
.. _example-mlp:

Train a neural network (MLP) regression
=======================================

A scikit-learn ``MLPRegressor`` gives the architecture and the initial weights; skl2onnx
converts it into ``MatMul``/``Add``/``Relu`` nodes whose initializers
(``coefficient``, ``intercepts``, ``coefficient1``, ...) are the weights the full
loop trains. scikit-learn then trains its own copy from the same point with the same settings:
both follow the same path.
"""

import warnings
from pprint import pprint

import matplotlib.pyplot as plt
import numpy as np
import onnxruntime
from skl2onnx import to_onnx
from sklearn.datasets import load_diabetes
from sklearn.metrics import r2_score
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from ort_train_core import OrtGradientOptimizer, add_loss_output

X, y = load_diabetes(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.25, random_state=0
)
scaler = StandardScaler().fit(X_train)
X_train = scaler.transform(X_train).astype(np.float32)
X_test = scaler.transform(X_test).astype(np.float32)
mean, std = y_train.mean(), y_train.std()
y_train = ((y_train - mean) / std).astype(np.float32)
y_test = ((y_test - mean) / std).astype(np.float32)

# %%
# The initial network
# -------------------
#
# One epoch of scikit-learn gives initialised weights; ``warm_start=True`` lets scikit-learn
# continue from them later.

EPOCHS, BATCH, ETA = 60, 16, 0.01
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # one epoch does not converge: that is the point
    mlp = MLPRegressor(
        hidden_layer_sizes=(32, 16),
        solver="sgd",
        learning_rate_init=ETA,
        momentum=0.0,
        alpha=0.0,
        batch_size=BATCH,
        shuffle=False,
        max_iter=1,
        warm_start=True,
        random_state=0,
    ).fit(X_train, y_train)
onx = to_onnx(mlp, X_train[:1])
print([n.op_type for n in onx.graph.node])
pprint([(i.name, tuple(i.dims)) for i in onx.graph.initializer], width=88, compact=True)

# %%
# Training with onnxruntime
# -------------------------
#
# scikit-learn minimises half the squared error, ours the squared error: its gradient is half
# ours, so the same steps take half its learning rate. ``shuffle=False`` on both sides gives
# the same batches in the same order.

trainer = OrtGradientOptimizer(
    add_loss_output(onx),
    max_iter=EPOCHS,
    batch_size=BATCH,
    learning_rate=ETA / 2,
    shuffle=False,
)
trainer.fit(X_train, y_train)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mlp.set_params(max_iter=EPOCHS, tol=0.0, n_iter_no_change=EPOCHS).fit(
        X_train, y_train
    )
sk_losses = 2 * np.array(
    mlp.loss_curve_[1:]
)  # back to the squared error, first epoch dropped

pred = trainer.get_trained_onnx()
print(
    f"last epoch loss: ort-train {trainer.train_losses_[-1]:.5f}, "
    f"scikit-learn {sk_losses[-1]:.5f}"
)

# %%
# The trained ONNX graph against scikit-learn's model on the test rows.

sess = onnxruntime.InferenceSession(
    pred.SerializeToString(), providers=["CPUExecutionProvider"]
)
ort_pred = sess.run(None, {"X": X_test})[0].ravel()
sk_pred = mlp.predict(X_test)
print(
    f"test R2: ort-train {r2_score(y_test, ort_pred):.4f}, "
    f"scikit-learn {r2_score(y_test, sk_pred):.4f}"
)

fig, ax = plt.subplots(figsize=(6, 4))
epochs = np.arange(1, EPOCHS + 1)
ax.plot(epochs, trainer.train_losses_, label="OrtGradientOptimizer (ONNX graph)")
ax.plot(epochs, sk_losses, "--", label="MLPRegressor (scikit-learn)")
ax.set_xlabel("epoch")
ax.set_ylabel("training loss (mean squared error)")
ax.set_title("MLP 10-32-16-1, SGD from the same weights")
ax.legend()
fig.tight_layout()
