"""
.. _example-mlp-classifier-partial:

An MLP classifier trained by the partial loop with the log loss
===============================================================

onnxcustom's last training example without a counterpart here: a scikit-learn MLP classifier
written as an ONNX graph, then trained by the partial loop
(:class:`~ort_train_core.OrtGradientForwardBackwardOptimizer`: onnxruntime computes the
gradient, the loss and the update are small graphs of their own) with
:class:`~ort_train_core.NegLogLearningLoss` on the softmax of the logits, timed against
scikit-learn's ``MLPClassifier`` taking the same epochs of the same SGD.
"""

import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from ort_train_core import (
    LearningRateSGD,
    NegLogLearningLoss,
    OrtGradientForwardBackwardOptimizer,
)

X, y = load_digits(return_X_y=True)
X = StandardScaler().fit_transform(X).astype(np.float32)
X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.3, random_state=0, stratify=y
)
params = dict(
    hidden_layer_sizes=(50,),
    solver="sgd",
    momentum=0.0,
    learning_rate_init=0.05,
    batch_size=32,
)

# %%
# The architecture and its initial weights: those of an ``MLPClassifier`` fitted for one epoch,
# written as an ONNX graph that ends at the logits (the softmax goes into the loss).

with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)
    start = MLPClassifier(max_iter=1, random_state=0, **params).fit(X_train, y_train)
(W1, W2), (b1, b2) = start.coefs_, start.intercepts_
mlp = helper.make_graph(
    [
        helper.make_node("MatMul", ["X", "W1"], ["z1"]),
        helper.make_node("Add", ["z1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["z2"]),
        helper.make_node("Add", ["z2", "b2"], ["logits"]),
    ],
    "mlp",
    [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", X.shape[1]])],
    [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
    [
        numpy_helper.from_array(v.astype(np.float32), n)
        for n, v in (("W1", W1), ("b1", b1), ("W2", W2), ("b2", b2))
    ],
)
model = helper.make_model(mlp, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8

# %%
# 30 epochs in onnxruntime, the negative log-likelihood of the softmax probabilities.

epochs = 30
trainer = OrtGradientForwardBackwardOptimizer(
    model,
    max_iter=epochs,
    batch_size=params["batch_size"],
    learning_rate=LearningRateSGD(
        eta0=params["learning_rate_init"], learning_rate="constant"
    ),
    learning_loss=NegLogLearningLoss(probability_function="softmax"),
    random_state=0,
)
t = time.perf_counter()
trainer.fit(X_train, y_train.astype(np.int64))
ours_seconds = time.perf_counter() - t

# %%
# scikit-learn: the same SGD for the same number of epochs (from its own initial weights, one
# epoch behind ours).

t = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)
    reference = MLPClassifier(
        max_iter=epochs, random_state=0, tol=0, n_iter_no_change=epochs, **params
    )
    reference.fit(X_train, y_train)
theirs_seconds = time.perf_counter() - t


sess = onnxruntime.InferenceSession(
    trainer.get_trained_onnx().SerializeToString(), providers=["CPUExecutionProvider"]
)
logits = sess.run(None, {sess.get_inputs()[0].name: X_test})[0]
ours_accuracy = float((logits.argmax(axis=1) == y_test).mean())
print(
    f"ort-train partial loop: {ours_seconds:.2f} s, test accuracy {ours_accuracy:.3f}"
)
theirs_accuracy = reference.score(X_test, y_test)
print(
    f"MLPClassifier:          {theirs_seconds:.2f} s, "
    f"test accuracy {theirs_accuracy:.3f}"
)

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(
    np.arange(1, epochs + 1), trainer.train_losses_, label="ort-train (partial loop)"
)
ax.plot(np.arange(1, epochs + 1), reference.loss_curve_, label="MLPClassifier")
ax.set_xlabel("epoch")
ax.set_ylabel("training log loss")
ax.legend()
fig.tight_layout()
