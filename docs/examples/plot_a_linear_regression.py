"""
.. _example-linear-regression:

Train a linear regression with the full loop
============================================

A linear model becomes an ONNX graph (skl2onnx), :func:`ort_train_core.add_loss_output`
appends the squared error to it, and :class:`ort_train_core.OrtGradientOptimizer` trains it:
one onnxruntime run per step computes the prediction, the loss, the gradients and the updated
weights. The trained graph then runs in any onnxruntime ``InferenceSession``.
"""

import warnings
from pprint import pprint

import matplotlib.pyplot as plt
import numpy as np
import onnxruntime
from skl2onnx import to_onnx
from sklearn.datasets import load_diabetes
from sklearn.linear_model import LinearRegression, SGDRegressor
from sklearn.metrics import r2_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from ort_train_core import OrtGradientOptimizer, add_loss_output

# %%
# Data
# ----
#
# The diabetes dataset bundled with scikit-learn, features and target standardised, in float32
# (the type of the ONNX graph).

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
print(X_train.shape, X_test.shape)

# %%
# The ONNX graph
# --------------
#
# ``black_op={"LinearRegressor"}`` makes skl2onnx write ``MatMul`` + ``Add`` with float
# initializers ``coef`` and ``intercept`` instead of the ``LinearRegressor`` operator, which has
# no gradient. The weights start from zero.

start = LinearRegression().fit(X_train, y_train)
start.coef_[:] = 0
start.intercept_ = np.zeros((), dtype=np.float64)
onx = to_onnx(start, X_train[:1], black_op={"LinearRegressor"})
print("nodes:", [n.op_type for n in onx.graph.node])
print("initializers:", [i.name for i in onx.graph.initializer])

# %%
# The loss
# --------
#
# :func:`~ort_train_core.add_loss_output` adds a ``label`` input and a scalar ``loss`` output
# (first among the outputs): the mean over the batch of the squared error.

onx_loss = add_loss_output(onx, score_name="squared_error")
print("inputs:", [i.name for i in onx_loss.graph.input])
print("outputs:", [o.name for o in onx_loss.graph.output])

# %%
# Training
# --------
#
# 50 epochs of minibatches of 16 rows, constant learning rate 0.005 (a float means constant
# SGD). Giving ``X_val``/``y_val`` records a validation loss after every epoch.

trainer = OrtGradientOptimizer(
    onx_loss,
    max_iter=50,
    batch_size=16,
    learning_rate=0.005,
    shuffle=True,
    random_state=0,
)
trainer.fit(X_train, y_train, X_val=X_test, y_val=y_test)
print(f"{trainer.n_iter_} epochs, last training loss {trainer.train_losses_[-1]:.4f}")
pprint({k: v.ravel()[:4] for k, v in trainer.get_state().items()}, width=88)

# %%
# The trained graph
# -----------------
#
# :meth:`~ort_train_core.OrtGradientOptimizer.get_trained_onnx` returns the prediction graph
# (no loss, no label) with the trained weights as initializers.

trained = trainer.get_trained_onnx()
sess = onnxruntime.InferenceSession(
    trained.SerializeToString(), providers=["CPUExecutionProvider"]
)
pred = sess.run(None, {sess.get_inputs()[0].name: X_test})[0].ravel()
r2_ort = r2_score(y_test, pred)

# scikit-learn's SGD with the same settings: its loss is (y - f)^2 / 2, so the same
# step needs a learning rate twice ours (it also updates row by row: batch_size=1)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    sgd = SGDRegressor(
        penalty=None, learning_rate="constant", eta0=0.005, max_iter=50, tol=None
    )
    sgd.fit(X_train, y_train)
exact = LinearRegression().fit(X_train, y_train)
r2_sgd = r2_score(y_test, sgd.predict(X_test))
print(f"test R2: ort-train {r2_ort:.4f}, SGDRegressor {r2_sgd:.4f}, ")
print(f"         least squares {r2_score(y_test, exact.predict(X_test)):.4f}")

# %%
# Loss per epoch
# --------------

fig, ax = plt.subplots(1, 2, figsize=(10, 4))
epochs = np.arange(1, trainer.n_iter_ + 1)
ax[0].plot(epochs, trainer.train_losses_, label="training")
ax[0].plot(epochs, trainer.validation_losses_, label="validation")
ax[0].set_xlabel("epoch")
ax[0].set_ylabel("mean squared error")
ax[0].set_yscale("log")
ax[0].set_title("OrtGradientOptimizer, linear model")
ax[0].legend()
ax[1].scatter(y_test, pred, s=8)
ax[1].plot([y_test.min(), y_test.max()], [y_test.min(), y_test.max()], "k--", lw=1)
ax[1].set_xlabel("target")
ax[1].set_ylabel("prediction of the trained ONNX graph")
ax[1].set_title(f"test R2 = {r2_ort:.3f}")
fig.tight_layout()
