"""
.. _example-classification:

Binary classification
=====================

Two ways to train a classifier on the breast-cancer dataset bundled with scikit-learn:
:class:`ort_train_sklearn.OrtSGDClassifier`, a drop-in for ``SGDClassifier(loss="log_loss")``,
and :class:`ort_train_sklearn.OnnxModelClassifier`, which fine-tunes a fitted scikit-learn
classifier: the graph is cut at its logits and trained with the cross-entropy. Both export a
graph that outputs the label and the probabilities.
"""

import warnings

import matplotlib.pyplot as plt
import numpy as np
import onnxruntime
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression, SGDClassifier
from sklearn.metrics import accuracy_score, log_loss, roc_curve
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from ort_train_sklearn import OnnxModelClassifier, OrtSGDClassifier

X, y = load_breast_cancer(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.3, random_state=0, stratify=y
)
scaler = StandardScaler().fit(X_train)
X_train = scaler.transform(X_train).astype(np.float32)
X_test = scaler.transform(X_test).astype(np.float32)

# %%
# A logistic regression by SGD
# ----------------------------
#
# The parameters are scikit-learn's, its schedules counted per sample as it counts them;
# ``batch_size`` (``'auto'`` by default: about 32 steps per epoch; 1 takes scikit-learn's
# per-sample steps exactly, one onnxruntime run per row) and ``training`` (``'full'`` or
# ``'partial'``) are ours.

ours = OrtSGDClassifier(
    loss="log_loss", alpha=1e-3, max_iter=20, tol=None, random_state=0
)
ours.fit(X_train, y_train)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    theirs = SGDClassifier(
        loss="log_loss", alpha=1e-3, max_iter=20, tol=None, random_state=0
    )
    theirs.fit(X_train, y_train)
for name, model in [("OrtSGDClassifier", ours), ("SGDClassifier", theirs)]:
    proba = model.predict_proba(X_test)
    print(
        f"{name:18s} accuracy {accuracy_score(y_test, model.predict(X_test)):.3f}"
        f"  log loss {log_loss(y_test, proba):.4f}"
    )

# %%
# The exported graph runs alone in onnxruntime and gives the same probabilities.

onx = ours.to_onnx()
sess = onnxruntime.InferenceSession(
    onx.SerializeToString(), providers=["CPUExecutionProvider"]
)
print([o.name for o in sess.get_outputs()])
label, proba = sess.run(None, {sess.get_inputs()[0].name: X_test})
print("same labels:", bool((label == ours.predict(X_test)).all()))
print(
    "largest probability gap:", float(np.abs(proba - ours.predict_proba(X_test)).max())
)

# %%
# Fine-tuning a fitted logistic regression
# ----------------------------------------
#
# A model fitted on a few rows only, then trained further on all the training rows, starting
# from its own weights.

small = LogisticRegression(C=0.1).fit(X_train[:40], y_train[:40])
tuned = OnnxModelClassifier(
    small, learning_rate_init=0.05, batch_size=16, max_iter=30, random_state=0
)
tuned.fit(X_train, y_train)
print(f"log loss before {log_loss(y_test, small.predict_proba(X_test)):.4f}")
print(f"log loss after  {log_loss(y_test, tuned.predict_proba(X_test)):.4f}")

# %%
# Training curves and ROC curves on the test rows.

fig, ax = plt.subplots(1, 2, figsize=(11, 4))
ax[0].plot(
    np.arange(1, len(ours.loss_curve_) + 1), ours.loss_curve_, label="OrtSGDClassifier"
)
ax[0].plot(
    np.arange(1, len(tuned.loss_curve_) + 1),
    tuned.loss_curve_,
    label="OnnxModelClassifier",
)
ax[0].set_xlabel("epoch")
ax[0].set_ylabel("training loss (log loss)")
ax[0].set_yscale("log")
ax[0].legend()
for name, model in [
    ("OrtSGDClassifier", ours),
    ("SGDClassifier", theirs),
    ("LogisticRegression (40 rows)", small),
    ("OnnxModelClassifier", tuned),
]:
    fpr, tpr, _ = roc_curve(y_test, model.predict_proba(X_test)[:, 1])
    ax[1].plot(fpr, tpr, label=name)
ax[1].set_xlabel("false positive rate")
ax[1].set_ylabel("true positive rate")
ax[1].set_xlim(-0.01, 0.3)
ax[1].legend(fontsize=8)
fig.suptitle("load_breast_cancer")
fig.tight_layout()
