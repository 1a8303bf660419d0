"""OnnxModelClassifier trains a graph cut at its logits, as torch exports a classifier (issue 17,
item 7): the same SGD steps as torch's CrossEntropyLoss on the same network, predict_proba the
softmax of torch's logits, and a deployable graph with Softmax and the label."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from ort_train_core.graph import MAX_IR_VERSION  # noqa: E402
from ort_train_sklearn import OnnxModelClassifier  # noqa: E402

N_FEATURES = 5
LR = 0.1


def _net(n_classes: int, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(N_FEATURES, 8), torch.nn.ReLU(), torch.nn.Linear(8, n_classes))


def _export(net: torch.nn.Module, flat: bool = False) -> onnx.ModelProto:
    """The TorchScript export of ``net`` (its logits, or their one column flattened to [N])."""
    module = torch.nn.Sequential(net, torch.nn.Flatten(0)) if flat else net
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (torch.zeros(2, N_FEATURES),),
            buffer,
            dynamo=False,
            input_names=["X"],
            output_names=["logits"],
            dynamic_axes={"X": {0: "N"}, "logits": {0: "N"}},
            opset_version=17,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
        )
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


def _data(n_classes: int, n: int = 48) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, N_FEATURES)).astype(np.float32)
    y = (np.arange(n) % n_classes).astype(np.int64)
    rng.shuffle(y)
    return X, y


def _torch_losses(net: torch.nn.Module, X: np.ndarray, y: np.ndarray, steps: int, batch: int) -> list[float]:
    """Each epoch's mean batch loss before the updates (torch's SGD, batches in row order)."""
    binary = net[-1].out_features == 1
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    epochs = []
    for _ in range(steps):
        losses = []
        for start in range(0, len(X), batch):
            xb = torch.from_numpy(X[start : start + batch])
            yb = torch.from_numpy(y[start : start + batch])
            opt.zero_grad()
            z = net(xb)
            if binary:
                loss = torch.nn.functional.binary_cross_entropy_with_logits(z[:, 0], yb.float())
            else:
                loss = torch.nn.functional.cross_entropy(z, yb)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        epochs.append(float(np.mean(losses)))
    return epochs


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    if z.shape[1] == 1:
        z = np.column_stack([np.zeros(len(z)), z])
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("training", ["full", "partial"])
@pytest.mark.parametrize("n_classes", [3, 2])
@pytest.mark.parametrize("batch", [48, 16], ids=["one-step-epochs", "three-step-epochs"])
def test_logits_graph_trains_as_torch(training: str, n_classes: int, batch: int) -> None:
    X, y = _data(n_classes)
    model = _export(_net(n_classes))
    clf = OnnxModelClassifier(
        model, learning_rate_init=LR, batch_size=batch, max_iter=4, shuffle=False, training=training
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=Warning)  # ConvergenceWarning after 4 epochs
        clf.fit(X, y)
    reference = _net(n_classes)
    expected = _torch_losses(reference, X, y, steps=4, batch=batch)
    np.testing.assert_allclose(clf.loss_curve_, expected, rtol=1e-4)
    np.testing.assert_array_equal(clf.classes_, np.arange(n_classes))
    with torch.no_grad():
        logits = reference(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(clf.predict_proba(X), _softmax(logits), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(clf.predict(X), np.argmax(logits, axis=1))


def test_binary_logit_column_and_flat_logits_train_as_torch() -> None:
    """One logit column ([N, 1], or flattened to [N]): the sigmoid cross-entropy, as torch's
    BCEWithLogitsLoss; the logit is that of the second class."""
    X, y = _data(2)
    expected = _torch_losses(_net(1), X, y, steps=3, batch=16)
    for flat in (False, True):
        clf = OnnxModelClassifier(
            _export(_net(1), flat=flat), learning_rate_init=LR, batch_size=16, max_iter=3, shuffle=False
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=Warning)
            clf.fit(X, y)
        np.testing.assert_allclose(clf.loss_curve_, expected, rtol=1e-4)


def test_deployed_logits_classifier_gives_label_and_softmax() -> None:
    """to_onnx(): the trained logits, then Softmax and the label, as the other classifiers ship;
    the labels passed as classes= name the logit columns."""
    import onnxruntime

    X, y = _data(3)
    labels = np.array(["cat", "dog", "emu"])
    clf = OnnxModelClassifier(_export(_net(3)), classes=labels, max_iter=1, learning_rate_init=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=Warning)
        clf.fit(X, labels[y])
    np.testing.assert_array_equal(clf.classes_, labels)
    deployed = clf.to_onnx()
    assert [o.name for o in deployed.graph.output] == ["label", "probabilities"]
    assert "Softmax" in [n.op_type for n in deployed.graph.node]
    sess = onnxruntime.InferenceSession(deployed.SerializeToString(), providers=["CPUExecutionProvider"])
    label, proba = sess.run(None, {"X": X})
    with torch.no_grad():
        logits = _net(3)(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(proba, _softmax(logits), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(label, labels[np.argmax(logits, axis=1)])
    np.testing.assert_array_equal(clf.predict(X), labels[np.argmax(logits, axis=1)])
