"""
.. _example-forward-backward:

Forward-backward training: Nesterov, an elastic loss and penalty
================================================================

:class:`ort_train_core.OrtGradientForwardBackwardOptimizer` trains the *prediction* graph:
onnxruntime-training runs its forward and its backward as two calls, and the loss, the penalty
and the update are small ONNX graphs of their own, each run on the same device. The loss, the
penalty and the learning rate are objects: this script trains the same network with several
of them.
"""

import warnings

import matplotlib.pyplot as plt
import numpy as np
import onnxruntime
from skl2onnx import to_onnx
from sklearn.datasets import load_diabetes
from sklearn.metrics import mean_squared_error
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from ort_train_core import (
    AbsoluteLearningLoss,
    ElasticLearningLoss,
    ElasticLearningPenalty,
    LearningRateAdam,
    LearningRateSGD,
    LearningRateSGDNesterov,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    SquareLearningLoss,
    add_loss_output,
)

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

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    init = MLPRegressor(hidden_layer_sizes=(32,), max_iter=1, random_state=0).fit(
        X_train, y_train
    )
onx = to_onnx(init, X_train[:1])  # the prediction graph: no loss in it

# %%
# Variants
# --------
#
# The penalty applies to the weights of rank 2 (the two ``coefficient`` matrices), not to the
# biases. Each learning rate keeps its own state per weight (Nesterov a velocity, Adam two
# moments) on the device.

variants = {
    "SGD, squared error": dict(
        learning_rate=LearningRateSGD(eta0=0.01, learning_rate="constant"),
        learning_loss=SquareLearningLoss(),
    ),
    "Nesterov, squared error": dict(
        learning_rate=LearningRateSGDNesterov(
            eta0=0.002, learning_rate="constant", momentum=0.9
        ),
        learning_loss=SquareLearningLoss(),
    ),
    "Nesterov, elastic loss + penalty": dict(
        learning_rate=LearningRateSGDNesterov(
            eta0=0.002, learning_rate="constant", momentum=0.9
        ),
        learning_loss=ElasticLearningLoss(l1_weight=0.5, l2_weight=0.5),
        learning_penalty=ElasticLearningPenalty(l1=1e-4, l2=1e-3),
    ),
    "Adam, absolute error": dict(
        learning_rate=LearningRateAdam(eta0=0.002),
        learning_loss=AbsoluteLearningLoss(),
    ),
}

results = {}
for name, params in variants.items():
    trainer = OrtGradientForwardBackwardOptimizer(
        onx, max_iter=50, batch_size=16, random_state=0, **params
    )
    trainer.fit(X_train, y_train)
    sess = onnxruntime.InferenceSession(
        trainer.get_trained_onnx().SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    pred = sess.run(None, {"X": X_test})[0].ravel()
    results[name] = (trainer, mean_squared_error(y_test, pred))
    objective, mse = trainer.train_losses_[-1], results[name][1]
    print(f"{name:34s} objective {objective:.4f}  test MSE {mse:.4f}")

# %%
# The same steps as the full loop
# -------------------------------
#
# Both loops build their loss, penalty and update from the same code: with the same settings
# and the same data order, the partial loop and the fused loop reach the same weights.

common = dict(
    max_iter=5,
    batch_size=16,
    learning_rate=LearningRateSGDNesterov(eta0=0.002),
    shuffle=False,
)
partial = OrtGradientForwardBackwardOptimizer(
    onx, learning_loss="square_error", **common
)
full = OrtGradientOptimizer(add_loss_output(onx, "squared_error"), **common)
partial.fit(X_train, y_train)
full.fit(X_train, y_train)
gap = max(
    np.abs(partial.get_state()[k] - full.get_state()[k]).max() for k in full.get_state()
)
print("largest weight difference after 5 epochs:", gap)
print("losses (partial):", np.round(partial.train_losses_, 6))
print("losses (full):   ", np.round(full.train_losses_, 6))

# %%
# Objective per epoch (each variant its own: loss plus penalty) and the test error.

fig, ax = plt.subplots(1, 2, figsize=(11, 4))
for name, (trainer, _) in results.items():
    epochs = np.arange(1, trainer.n_iter_ + 1)
    ax[0].plot(epochs, trainer.train_losses_, label=name)
ax[0].set_xlabel("epoch")
ax[0].set_ylabel("training objective")
ax[0].set_yscale("log")
ax[0].legend(fontsize=8)
ax[1].barh(list(results), [mse for _, mse in results.values()])
ax[1].set_xlabel("test mean squared error")
ax[1].invert_yaxis()
fig.suptitle("OrtGradientForwardBackwardOptimizer, MLP 10-32-1")
fig.tight_layout()
