"""ort-train's metadata (``ort_train.*`` keys) in a model file is checked before it is used
(issue 26, item 6).

A model file is the user's: a forged ``ort_train.data_loss_name`` made ``validation_losses_`` a
constant, a stale one failed in onnxruntime with a rank error, and invalid or deeply nested JSON
raised ``JSONDecodeError`` or ``RecursionError``. Each key read is now checked (the names exist in
the graph, the data loss is a scalar computed from the label and read by the loss) or ignored with
a warning naming the key; the values are checked against numpy.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from core_models import build_linear
from onnx import helper

import ort_train_core
from ort_train_core import OrtGradientOptimizer
from ort_train_core.graph import get_metadata

L2 = 5.0


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3 + rng.standard_normal(60)).astype(np.float32)
    return X, y


def _loss_model() -> onnx.ModelProto:
    model = build_linear(3, 1, coef=np.zeros((3, 1)), intercept=np.zeros(1))
    return ort_train_core.add_loss_output(model, penalty={"coef": {"l2": L2}})


def _set(model: onnx.ModelProto, key: str, text: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for prop in out.metadata_props:
        if prop.key == f"ort_train.{key}":
            prop.value = text
            return out
    out.metadata_props.add(key=f"ort_train.{key}", value=text)
    return out


def _penalty_term(model: onnx.ModelProto) -> str:
    """The output of the node adding the penalty's term: a scalar the loss reads, computed from
    the weights only (not from the label)."""
    objective = next(n for n in model.graph.node if n.op_type == "Add" and "objective" in n.output[0])
    return objective.input[1]


def _fit_validation_loss(model: onnx.ModelProto) -> tuple[float, float]:
    """(last validation loss, numpy's penalised mean squared error of the trained weights)."""
    X, y = _data()
    trainer = OrtGradientOptimizer(model, max_iter=2, batch_size=10, learning_rate=0.01, shuffle=False)
    trainer.fit(X[:40], y[:40], X_val=X[40:], y_val=y[40:])
    state = trainer.get_state()
    pred = X[40:] @ state["coef"] + state["intercept"]
    mse = float(np.mean((pred.ravel() - y[40:]) ** 2))
    return trainer.validation_losses_[-1], mse + L2 * float(np.sum(state["coef"] ** 2))


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("penalty term", "does not depend on the label"),
        ("constant", "the loss 'loss' does not read 'const_out'"),
        ("stale", "is not a value of the graph"),
        ("label", "is not computed by a node"),
        ("not json", "not valid JSON"),
        ("deep json", "not valid JSON"),
        ("not a name", "not a string"),
    ],
)
def test_untrusted_data_loss_name_is_ignored_with_a_warning(case: str, why: str) -> None:
    model = _loss_model()
    value = {
        "penalty term": '"' + _penalty_term(model) + '"',
        "constant": '"const_out"',
        "stale": '"loss_gone"',
        "label": '"label"',
        "not json": "{not json",
        "deep json": "[" * 100_000 + "]" * 100_000,
        "not a name": "[1, 2]",
    }[case]
    forged = _set(model, "data_loss_name", value)
    if case == "constant":  # a scalar Constant node, read by nothing
        forged.graph.node.append(
            helper.make_node("Constant", [], ["const_out"], value_float=0.5, name="forged_constant")
        )
    with pytest.warns(
        UserWarning, match=rf"ignoring the model's metadata 'ort_train\.data_loss_name'.*{why}"
    ):
        got, penalised = _fit_validation_loss(forged)
    # without a trusted data loss the validation loss is the whole objective, penalty included
    np.testing.assert_allclose(got, penalised, rtol=1e-5)


def test_valid_data_loss_name_is_kept_without_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, penalised = _fit_validation_loss(_loss_model())
    assert got < penalised  # the penalty is left out


@pytest.mark.parametrize(
    ("key", "text", "why"),
    [
        ("label_name", "[" * 50_000 + "]" * 50_000, "not valid JSON"),
        ("label_name", '"y_true"', "is not an input of the graph"),
        ("loss_name", '"nothing"', "is not an output of the graph"),
        ("weight_name", '"coef"', "is not an input of the graph"),
        ("prediction_outputs", '["Y", "nope"]', "'nope' is not an output of the graph"),
        ("reduction", '"median"', "not one of"),
        ("n_classes", '"3"', "not an integer >= 2"),
        ("n_classes", "1e400", "not an integer >= 2"),
    ],
)
def test_each_key_is_checked(key: str, text: str, why: str) -> None:
    forged = _set(_loss_model(), key, text)
    with pytest.warns(UserWarning, match=rf"ignoring the model's metadata 'ort_train\.{key}'.*{why}"):
        assert get_metadata(forged, key) is None


def test_fit_goes_on_with_defaults_after_forged_label_name() -> None:
    # the label input is 'label'; a forged name would have the trainer feed an input that
    # does not exist
    forged = _set(_loss_model(), "label_name", '"y_true"')
    with pytest.warns(UserWarning, match=r"'ort_train\.label_name'.*'y_true' is not an input"):
        got, penalised = _fit_validation_loss(forged)
    assert got < penalised  # data_loss_name still trusted: it depends on the true label


def test_forged_running_statistics_are_ignored() -> None:
    from ort_train_core._batchnorm import UPDATES_KEY, update_outputs

    model = _loss_model()
    for text in ("no pairs here", "coef=Y;nothing=nowhere"):
        forged = onnx.ModelProto()
        forged.CopyFrom(model)
        forged.metadata_props.add(key=UPDATES_KEY, value=text)
        with pytest.warns(UserWarning, match=rf"ignoring the model's metadata '{UPDATES_KEY}'"):
            assert update_outputs(forged) == {}
