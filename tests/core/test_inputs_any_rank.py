"""Inputs that are not a 2-D float matrix (issue 17, item 1): images [N, C, H, W], int64 ids,
boolean masks and several inputs (a dict by input name or a tuple in graph order) train on
both loops exactly as numpy's SGD on the same math; bad input names the input and the fix."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backend_support import training_build_only
from ort_train_core import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output

N, LR, EPOCHS, BATCH = 24, 0.05, 3, 8
rng = np.random.default_rng(0)


def _model(
    inputs: list[onnx.ValueInfoProto], nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray]
) -> Any:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", None])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _linear_head(source: str) -> list[onnx.NodeProto]:
    return [helper.make_node("MatMul", [source, "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["Y"])]


def image_model() -> tuple[Any, dict[str, np.ndarray]]:
    """X [N, 2, 3, 3] -> Reshape [N, 18] -> MatMul W + b."""
    inits = {
        "shape": np.array([-1, 18], dtype=np.int64),
        "W": rng.standard_normal((18, 2)).astype(np.float32) * 0.1,
        "b": np.zeros(2, dtype=np.float32),
    }
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2, 3, 3])
    nodes = [helper.make_node("Reshape", ["X", "shape"], ["flat"]), *_linear_head("flat")]
    return _model([x], nodes, inits), {k: v for k, v in inits.items() if k != "shape"}


def ids_model() -> tuple[Any, dict[str, np.ndarray]]:
    """ids int64 [N, 4] -> Gather(E) [N, 4, 3] -> ReduceMean over the tokens -> MatMul W + b."""
    inits = {
        "E": rng.standard_normal((10, 3)).astype(np.float32),
        "axes": np.array([1], dtype=np.int64),
        "W": rng.standard_normal((3, 1)).astype(np.float32) * 0.5,
        "b": np.zeros(1, dtype=np.float32),
    }
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["emb"]),
        helper.make_node("ReduceMean", ["emb", "axes"], ["pooled"], keepdims=0),
        *_linear_head("pooled"),
    ]
    return _model([ids], nodes, inits), {k: v for k, v in inits.items() if k != "axes"}


def two_input_model(mask: bool = False) -> tuple[Any, dict[str, np.ndarray]]:
    """A [N, 3] and B [N, 2] -> Concat -> MatMul W + b; with ``mask``, B is a bool [N, 5] mask
    applied to Concat(A, A[:, :2]) by Where (masked features read as zeros)."""
    inits = {"W": rng.standard_normal((5, 1)).astype(np.float32) * 0.3, "b": np.zeros(1, dtype=np.float32)}
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, ["N", 3])
    if not mask:
        b = helper.make_tensor_value_info("B", TensorProto.FLOAT, ["N", 2])
        nodes = [helper.make_node("Concat", ["A", "B"], ["cat"], axis=1), *_linear_head("cat")]
        return _model([a, b], nodes, inits), inits
    inits_all = {**inits, "zero": np.array(0, dtype=np.float32), "two": np.array([0, 2], dtype=np.int64)}
    m = helper.make_tensor_value_info("M", TensorProto.BOOL, ["N", 5])
    nodes = [
        helper.make_node("Slice", ["A", "two_start", "two_end", "one_axis"], ["a2"]),
        helper.make_node("Concat", ["A", "a2"], ["cat"], axis=1),
        helper.make_node("Where", ["M", "cat", "zero"], ["masked"]),
        *_linear_head("masked"),
    ]
    inits_all.pop("two")
    inits_all.update(
        two_start=np.array([0], dtype=np.int64),
        two_end=np.array([2], dtype=np.int64),
        one_axis=np.array([1], dtype=np.int64),
    )
    return _model([a, m], nodes, inits_all), inits


def _numpy_sgd(
    features: Any, y: np.ndarray, weights: dict[str, np.ndarray], kind: str
) -> dict[str, np.ndarray]:
    """SGD on the mean over rows of the summed squared error (the trainers' squared loss), in
    float64, batches of BATCH in order, for EPOCHS epochs."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    for _ in range(EPOCHS):
        for s in range(0, N, BATCH):
            rows = slice(s, s + BATCH)
            yb = y[rows].reshape(-1, w["W"].shape[1])
            if kind == "ids":
                ids = features[rows]
                h = w["E"][ids].mean(axis=1)
            elif kind == "image":
                h = features[rows].reshape(len(yb), -1).astype(np.float64)
            else:
                h = features[rows].astype(np.float64)
            g = 2 * (h @ w["W"] + w["b"] - yb) / len(yb)  # d loss / d prediction
            if kind == "ids":
                dh = g @ w["W"].T / ids.shape[1]
                dE = np.zeros_like(w["E"])
                for j in range(ids.shape[1]):
                    np.add.at(dE, ids[:, j], dh)
                w["E"] -= LR * dE
            w["W"] -= LR * (h.T @ g)
            w["b"] -= LR * g.sum(axis=0)
    return w


ROUTES = ["full", "partial"]


def _trainer(route: str, model: Any, **kwargs: Any) -> Any:
    params = dict(max_iter=EPOCHS, batch_size=BATCH, learning_rate=LR, shuffle=False, **kwargs)
    if route == "full":
        return OrtGradientOptimizer(add_loss_output(model), **params)
    return OrtGradientForwardBackwardOptimizer(model, **params)


def _assert_state(trainer: Any, expected: dict[str, np.ndarray]) -> None:
    state = trainer.get_state()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("route", ROUTES)
def test_images_train_as_numpy(route: str) -> None:
    model, weights = image_model()
    X = rng.standard_normal((N, 2, 3, 3))  # float64: cast to the input's float32
    y = rng.standard_normal((N, 2)).astype(np.float32)
    trainer = _trainer(route, model).fit(X, y)
    _assert_state(trainer, _numpy_sgd(X.astype(np.float32), y, weights, "image"))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float64])
def test_token_ids_stay_integers(route: str, dtype: Any) -> None:
    """int64 ids feed the Gather as ids (int32 and integral floats are converted, not
    rejected); the embedding rows they select are trained."""
    model, weights = ids_model()
    ids = rng.integers(0, 10, size=(N, 4))
    y = rng.standard_normal((N, 1)).astype(np.float32)
    trainer = _trainer(route, model).fit(ids.astype(dtype), y)
    _assert_state(trainer, _numpy_sgd(ids, y, weights, "ids"))


@pytest.mark.parametrize("route", ROUTES)
def test_two_inputs_as_dict_or_tuple(route: str) -> None:
    model, weights = two_input_model()
    A = rng.standard_normal((N, 3)).astype(np.float32)
    B = rng.standard_normal((N, 2)).astype(np.float32)
    y = rng.standard_normal(N).astype(np.float32)
    expected = _numpy_sgd(np.hstack([A, B]), y, weights, "matrix")
    by_dict = _trainer(route, model).fit({"B": B, "A": A}, y)  # keys in any order
    _assert_state(by_dict, expected)
    by_tuple = _trainer(route, model).fit((A, B), y)
    _assert_state(by_tuple, expected)


@pytest.mark.parametrize("route", ROUTES)
def test_boolean_mask_input(route: str) -> None:
    model, weights = two_input_model(mask=True)
    A = rng.standard_normal((N, 3)).astype(np.float32)
    M = rng.random((N, 5)) > 0.3
    y = rng.standard_normal(N).astype(np.float32)
    masked = np.where(M, np.hstack([A, A[:, :2]]), 0)
    trainer = _trainer(route, model).fit({"A": A, "M": M}, y)
    _assert_state(trainer, _numpy_sgd(masked, y, weights, "matrix"))
    # 0/1 integers are booleans too
    again = _trainer(route, model).fit({"A": A, "M": M.astype(np.int64)}, y)
    _assert_state(again, _numpy_sgd(masked, y, weights, "matrix"))


def test_validation_data_with_several_inputs() -> None:
    """The validation loss of a two-input graph, fed as a dict, is numpy's mean squared error
    with the epoch's weights."""
    model, _ = two_input_model()
    A, B = rng.standard_normal((N, 3)), rng.standard_normal((N, 2))
    Av, Bv = rng.standard_normal((10, 3)), rng.standard_normal((10, 2))
    y, yv = rng.standard_normal(N), rng.standard_normal(10)
    trainer = _trainer("full", model).set_params(max_iter=1)
    trainer.fit({"A": A, "B": B}, y, X_val=(Av, Bv), y_val=yv)
    w = trainer.get_state()
    pred = np.hstack([Av, Bv]) @ w["W"].astype(np.float64) + w["b"]
    expected = float(((pred[:, 0] - yv) ** 2).mean())
    assert trainer.validation_losses_[0] == pytest.approx(expected, rel=1e-5)


def test_prediction_graph_runs_on_the_trained_weights() -> None:
    """The exported graph keeps the int64 input and predicts as numpy with the trained weights."""
    import onnxruntime

    model, _ = ids_model()
    ids = rng.integers(0, 10, size=(N, 4))
    y = rng.standard_normal((N, 1)).astype(np.float32)
    trainer = _trainer("full", model).fit(ids, y)
    trained = trainer.get_trained_onnx()
    assert trained.graph.input[0].type.tensor_type.elem_type == TensorProto.INT64
    sess = onnxruntime.InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    w = trainer.get_state()
    expected = w["E"][ids].mean(axis=1) @ w["W"] + w["b"]
    np.testing.assert_allclose(sess.run(None, {"ids": ids})[0], expected, rtol=1e-5, atol=1e-6)


# ---- bad input ------------------------------------------------------------------------------


def _images() -> tuple[Any, np.ndarray]:
    model, _ = image_model()
    return model, rng.standard_normal((N, 2)).astype(np.float32)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((N, 18), r"X must be 4-D: the model's input 'X' has shape \(n, 2, 3, 3\), got shape \(24, 18\)"),
        ((N, 2, 3, 4), r"X has 4 on axis 3 but the model's input 'X' has shape \(n, 2, 3, 3\)"),
        ((N, 3, 3, 3), r"X has 3 on axis 1"),
    ],
)
def test_wrong_image_shape_names_the_expected_shape(route: str, shape: tuple, message: str) -> None:
    model, y = _images()
    with pytest.raises(ValueError, match=message):
        _trainer(route, model).fit(np.zeros(shape, dtype=np.float32), y)


@pytest.mark.parametrize("route", ROUTES)
def test_fractional_ids_are_refused(route: str) -> None:
    model, _ = ids_model()
    ids = rng.integers(0, 10, size=(N, 4)).astype(np.float64)
    ids[3, 1] = 2.5
    with pytest.raises(
        ValueError, match=r"X feeds the integer input 'ids' \(int64: ids or indices\) but holds fractions"
    ):
        _trainer(route, model).fit(ids, np.zeros((N, 1)))


def test_ids_beyond_int32_are_refused() -> None:
    """An int32 input cannot hold 2**31: the cast would wrap around to another id."""
    model, _ = ids_model()
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    ids = rng.integers(0, 10, size=(N, 4))
    ids[0, 0] = 2**31
    with pytest.raises(ValueError, match=r"beyond the range of int32"):
        _trainer("full", model).fit(ids, np.zeros((N, 1)))


@pytest.mark.parametrize(
    ("X", "error", "message"),
    [
        ({"A": np.zeros((N, 3))}, ValueError, r"missing \['B'\]"),
        ({"A": np.zeros((N, 3)), "B": np.zeros((N, 2)), "C": np.zeros(N)}, ValueError, r"unknown \['C'\]"),
        ((np.zeros((N, 3)),), TypeError, r"tuple of 2 arrays in that order, not a tuple of 1 items"),
        (np.zeros((N, 5)), TypeError, r"the model has 2 batched inputs \['A', 'B'\]: give X as a dict"),
        (
            {"A": np.zeros((N, 3)), "B": np.zeros((N - 1, 2))},
            ValueError,
            r"different row counts: \{'A': 24, 'B': 23\}",
        ),
        (
            {"A": np.zeros((N, 3)), "B": np.zeros((N, 3))},
            ValueError,
            r"X\['B'\] has 3 features but the model expects 2",
        ),
        ({"A": np.full((N, 3), np.nan), "B": np.zeros((N, 2))}, ValueError, r"X\['A'\] contains 72 NaN"),
    ],
)
def test_several_inputs_bad_forms(X: Any, error: type, message: str) -> None:
    model, _ = two_input_model()
    trainer = _trainer("full", model)
    with pytest.raises(error, match=message):
        trainer.fit(X, np.zeros(N))
    assert not hasattr(trainer, "_state") or trainer.n_iter_ == 0


def test_mask_of_other_values_is_refused() -> None:
    model, _ = two_input_model(mask=True)
    with pytest.raises(ValueError, match=r"X\['M'\] feeds the boolean input 'M': give booleans"):
        _trainer("full", model).fit({"A": np.zeros((N, 3)), "M": np.full((N, 5), 2)}, np.zeros(N))


def test_resume_fingerprints_every_input(tmp_path: Any) -> None:
    """A checkpoint written on one pair of inputs refuses to resume on another B."""
    from ort_train_core.exceptions import CheckpointMismatchError

    model, _ = two_input_model()
    A, B = rng.standard_normal((N, 3)), rng.standard_normal((N, 2))
    y = rng.standard_normal(N)
    trainer = _trainer("full", model, checkpoint_dir=tmp_path).set_params(max_iter=1)
    trainer.fit({"A": A, "B": B}, y)
    again = _trainer("full", model, checkpoint_dir=tmp_path)
    with pytest.raises(CheckpointMismatchError, match="data"):
        again.resume({"A": A, "B": B + 1}, y)
    again.resume((A, B), y)  # the same data as a tuple: accepted
    assert again.n_iter_ == EPOCHS


# ---- run-time failures of onnxruntime -------------------------------------------------------


@training_build_only("the graph is refused before onnxruntime runs it (rank unknown)")
@pytest.mark.parametrize("route", ROUTES)
def test_onnxruntime_failure_during_a_step_is_one_clean_error(route: str) -> None:
    """Features wider than the weight, through an input whose width the graph leaves open,
    fail inside onnxruntime at the first step (the partial loop's first forward). The error
    names the node and operator without the C++ context, and the weights are those before the
    fit. (This test used a one-element constant broadcast by Where, whose gradient onnxruntime
    did not reduce; that form is rewritten now and trains.)"""
    from onnx import TensorProto
    from onnx import helper as h

    from ort_train_core.exceptions import TrainingStepError

    graph = h.make_graph(
        [h.make_node("MatMul", ["X", "W"], ["xw"]), h.make_node("Add", ["xw", "b"], ["Y"])],
        "open_width",
        [h.make_tensor_value_info("X", TensorProto.FLOAT, ["N", None])],
        [h.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])],
        [
            numpy_helper.from_array(np.ones((3, 1), np.float32), "W"),
            numpy_helper.from_array(np.zeros(1, np.float32), "b"),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    trainer = _trainer(route, model)
    before = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    with pytest.raises(TrainingStepError) as info:
        trainer.fit(np.ones((N, 4), np.float32), np.zeros(N))
    message = str(info.value)
    assert message.startswith("onnxruntime failed at epoch 1, batch 1"), message
    assert ".cc:" not in message, message
    assert "onnxruntime::" not in message, message
    assert "(operator " in message, message
    assert "weights_to_train" in message, message
    assert (info.value.epoch, info.value.batch) == (0, 0)
    for name, value in trainer.get_state().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


@pytest.mark.parametrize("route", ROUTES)
def test_an_id_outside_the_table_is_named_as_such(route: str, capfd: pytest.CaptureFixture[str]) -> None:
    """An embedding's Gather given an id past its table fails in onnxruntime: the error says
    which ids the table takes, not to leave weights out of weights_to_train; onnxruntime's own
    log line (C++ file and line) is not printed beside it."""
    from onnx import TensorProto
    from onnx import helper as h

    from ort_train_core.exceptions import TrainingStepError

    graph = h.make_graph(
        [
            h.make_node("Gather", ["E", "ids"], ["e"]),
            h.make_node("ReduceMean", ["e"], ["Y"], axes=[1, 2], keepdims=0),
        ],
        "embedding",
        [h.make_tensor_value_info("ids", TensorProto.INT64, [None, 4])],
        [h.make_tensor_value_info("Y", TensorProto.FLOAT, [None])],
        [numpy_helper.from_array(np.ones((10, 1), np.float32), "E")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    ids = np.arange(16, dtype=np.int64).reshape(4, 4) % 12  # 10 and 11 are past the table
    trainer = _trainer(route, model)
    with pytest.raises(TrainingStepError, match=r"idx=1[01] .* takes ids 0 to N - 1") as info:
        trainer.fit(ids, np.zeros(4, np.float32))
    assert "weights_to_train" not in str(info.value)
    assert ".cc:" not in capfd.readouterr().err
