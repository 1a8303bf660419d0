"""
.. _example-linear-regression-details:

The full loop in details
========================

What :class:`ort_train_core.OrtGradientOptimizer` builds and runs for the linear regression of
:ref:`example-linear-regression`: the loss graph, the fused step graph (its inputs and outputs),
how a step binds its buffers, and how the weights move epoch after epoch.
"""

import collections
import tempfile
from pprint import pprint

import matplotlib.pyplot as plt
import numpy as np
import onnx
import onnxruntime
from skl2onnx import to_onnx
from sklearn.datasets import load_diabetes
from sklearn.linear_model import LinearRegression
from sklearn.preprocessing import StandardScaler

from ort_train_core import OrtGradientOptimizer, add_loss_output

X, y = load_diabetes(return_X_y=True)
X = StandardScaler().fit_transform(X).astype(np.float32)
y = ((y - y.mean()) / y.std()).astype(np.float32)

start = LinearRegression().fit(X, y)
start.coef_[:] = 0
start.intercept_ = np.zeros((), dtype=np.float64)
onx = to_onnx(start, X[:1], black_op={"LinearRegressor"})

# %%
# The loss graph
# --------------
#
# :func:`~ort_train_core.add_loss_output` appends the loss nodes after the prediction
# ``variable``, adds the ``label`` input and records the names it chose in the model's metadata
# (the trainer reads them there).

onx_loss = add_loss_output(onx)
for node in onx_loss.graph.node:
    print(f"{node.op_type:10s} {list(node.input)} -> {list(node.output)}")
for prop in onx_loss.metadata_props:
    print(prop.key, "=", prop.value)


def describe(values):
    """name: element type and shape of graph inputs or outputs."""
    out = []
    for v in values:
        tt = v.type.tensor_type
        shape = [d.dim_value or d.dim_param for d in tt.shape.dim]
        out.append(f"{v.name}: {onnx.TensorProto.DataType.Name(tt.elem_type)}{shape}")
    return out


# %%
# The fused step graph
# --------------------
#
# At the first :meth:`~ort_train_core.OrtGradientOptimizer.fit`, the trainer turns the weights
# into graph inputs, asks onnxruntime-training's gradient builder for ``<weight>_grad`` outputs,
# and appends the update of the learning rate: ``W_new = W - eta * W_grad`` for SGD. The batch
# dimension is fixed: one graph per distinct batch size (here 100 and the last, shorter batch
# of 42 rows). :meth:`~ort_train_core.OrtGradientOptimizer.save_onnx_graph` writes every graph.

trainer = OrtGradientOptimizer(
    onx_loss, max_iter=1, batch_size=100, learning_rate=0.05, random_state=0
)
trainer.fit(X, y)
folder = tempfile.mkdtemp()
paths = trainer.save_onnx_graph(folder)
print(sorted(paths))
fused = onnx.load(paths["fused_step_batch100"])
print("inputs: ", *describe(fused.graph.input), sep="\n  ")
print("outputs:", *describe(fused.graph.output), sep="\n  ")
pprint(
    collections.Counter(n.op_type for n in fused.graph.node).most_common(),
    width=88,
    compact=True,
)

# %%
# Data inputs (``X``, ``label``), the current weights, the learning rate as a 0-d input (it
# changes with the epoch without changing the graph); the loss, then the new weights. Adam or
# momentum add their states as inputs and outputs beside the weights.
#
# One step by hand
# ----------------
#
# The trainer binds every buffer once with an ``IOBinding``: the batch (a buffer on the
# device that keeps its rows for the whole fit; on CPU a view of one copy of the data), the
# weights of the current parity as inputs, the buffers of the other parity as outputs, the
# learning rate as a host scalar that it rewrites in place. After a step the parities swap: a
# graph never reads and writes the same buffer. The same mechanism with onnxruntime's public
# API:

sess = onnxruntime.InferenceSession(
    paths["fused_step_batch100"], providers=["CPUExecutionProvider"]
)
coef = [np.zeros((10, 1), dtype=np.float32) for _ in range(2)]  # two parities
intercept = [np.zeros(1, dtype=np.float32) for _ in range(2)]
eta = np.array(0.05, dtype=np.float32)
loss = np.zeros((), dtype=np.float32)
# the numpy arrays must outlive the OrtValues that view them
ortvalue = onnxruntime.OrtValue.ortvalue_from_numpy
batch = [(X[s : s + 100], y[s : s + 100, None]) for s in range(0, 400, 100)]
bindings = []
for parity in (0, 1):
    b = sess.io_binding()
    b.bind_ortvalue_input("coef", ortvalue(coef[parity]))
    b.bind_ortvalue_input("intercept", ortvalue(intercept[parity]))
    b.bind_ortvalue_input("opt_learning_rate", ortvalue(eta))
    b.bind_ortvalue_output("loss", ortvalue(loss))
    b.bind_ortvalue_output("opt_coef_new", ortvalue(coef[1 - parity]))
    b.bind_ortvalue_output("opt_intercept_new", ortvalue(intercept[1 - parity]))
    bindings.append(b)
parity = 0
for xb, yb in batch:
    b = bindings[parity]
    b.bind_ortvalue_input("X", ortvalue(xb))
    b.bind_ortvalue_input("label", ortvalue(yb))
    sess.run_with_iobinding(b)
    # the same step in numpy: gradient of mean((X w + b - y)^2)
    w, c = coef[parity], intercept[parity]
    diff = xb @ w + c - yb
    expected = w - eta * 2 * xb.T @ diff / len(xb)
    gap = np.abs(coef[1 - parity] - expected).max()
    print(f"loss {float(loss):.5f}  max |W_new - numpy| = {gap:.2e}")
    parity = 1 - parity

# %%
# Weights per epoch
# -----------------
#
# ``warm_start=True`` continues from the current weights, optimizer state and shuffling: one
# epoch per call gives the trajectory of the weights.

trainer = OrtGradientOptimizer(
    onx_loss,
    max_iter=1,
    batch_size=16,
    learning_rate=0.002,
    warm_start=True,
    random_state=0,
)
history = [trainer.get_state()["coef"].ravel()]
for _ in range(40):
    trainer.fit(X, y)
    history.append(trainer.get_state()["coef"].ravel())
history = np.array(history)
print("epochs:", trainer.n_iter_, "last loss:", round(trainer.train_losses_[-1], 5))

fig, ax = plt.subplots(1, 2, figsize=(10, 4))
for k in range(history.shape[1]):
    ax[0].plot(history[:, k], label=f"coef[{k}]")
ax[0].set_xlabel("epoch")
ax[0].set_title("weights per epoch")
ax[0].legend(fontsize=7, ncol=2)
ax[1].plot(np.arange(1, trainer.n_iter_ + 1), trainer.train_losses_)
ax[1].set_xlabel("epoch")
ax[1].set_ylabel("training loss")
ax[1].set_title("mean squared error")
fig.tight_layout()
