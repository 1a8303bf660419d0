"""``ort-train export-step`` (issue 29): the written step, looped over by a bare
``onnxruntime.InferenceSession`` from its file, trains to the weights of ``OrtGradientOptimizer``
with the same settings (``backend='onnx'``, ``shuffle=False``); the ``.npz`` holds the step's
defaults; ``--for-js`` writes a step without defaults and a graph of the initial state;
``--external-data`` writes a step that onnxruntime still loads; bad input exits with 2 and a
clear message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.testing import assert_allclose

from ort_train_core import (
    LearningRateAdam,
    LearningRateSGD,
    LearningRateSGDNesterov,
    add_loss_output,
    export_training_step,
)
from ort_train_core.cli import main
from ort_train_core.exceptions import GraphNotDifferentiableError
from step_support import BATCH, STEPS, WEIGHTS, digits, initializers, mlp, reference_fit

ATOL = 1e-6


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("export_step") / "mlp.onnx"
    onnx.save(mlp(), path)
    return path


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the warning that an initializer is also an input, by design
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def loop(sess: ort.InferenceSession, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The user's loop: the batch and the labels in, each ``<name>_new`` fed back as ``<name>``."""
    X, y = digits()
    names = [o.name.removesuffix("_new") for o in sess.get_outputs()]
    state = dict(state)
    for s in range(0, len(X), BATCH):
        _, *new = sess.run(None, {**state, "X": X[s : s + BATCH], "label": y[s : s + BATCH]})
        state.update(zip(names[1:], new))
    return state


def trainer_weights(lr: Any) -> dict[str, np.ndarray]:
    X, y = digits()
    return initializers(reference_fit(add_loss_output(mlp(), "cross_entropy"), lr, X, y).get_trained_onnx())


def export(model_file: Path, out: Path, *options: str) -> None:
    argv = [str(model_file), "--loss", "cross_entropy", "--batch-size", str(BATCH), "--out", str(out)]
    assert main(["export-step", *argv, *options]) == 0


def max_diff(state: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> float:
    for name in WEIGHTS:
        assert_allclose(state[name], expected[name], atol=ATOL, rtol=0, err_msg=name)
    return max(float(np.abs(state[n] - expected[n]).max()) for n in WEIGHTS)


OPTIONS = {
    "sgd": (["--optimizer", "sgd", "--lr", "0.1"], lambda: LearningRateSGD(0.1, learning_rate="constant")),
    "momentum": (
        ["--optimizer", "momentum", "--lr", "0.05", "--momentum", "0.8"],
        lambda: LearningRateSGDNesterov(eta0=0.05, learning_rate="constant", momentum=0.8, nesterov=False),
    ),
    "adam": (["--optimizer", "adam", "--lr", "0.01"], lambda: LearningRateAdam(eta0=0.01)),
}


@pytest.mark.parametrize("optimizer", list(OPTIONS))
def test_the_written_step_trains_to_the_trainers_weights(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], optimizer: str
) -> None:
    options, lr = OPTIONS[optimizer]
    export(model_file, tmp_path / "step.onnx", *options)
    printed = capsys.readouterr().out
    assert f"wrote: {tmp_path / 'step.onnx'}" in printed
    assert f"wrote: {tmp_path / 'step.npz'}" in printed
    assert "data input: X: float32 [8, 64]" in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step.npz", "step.onnx"]
    onnx.checker.check_model(str(tmp_path / "step.onnx"), full_check=True)
    state = loop(session(tmp_path / "step.onnx"), {})  # the first step needs only data
    max_diff(state, trainer_weights(lr()))
    if optimizer == "adam":
        assert int(state["step"]) == STEPS


def test_the_npz_holds_the_steps_defaults(model_file: Path, tmp_path: Path) -> None:
    export(model_file, tmp_path / "step.onnx", "--optimizer", "adam")
    step = onnx.load(tmp_path / "step.onnx")
    defaults = initializers(step)
    with np.load(tmp_path / "step.npz") as saved:
        npz = dict(saved)
    states = [f"{w}_{m}" for w in WEIGHTS for m in ("moment1", "moment2")]
    assert list(npz) == ["learning_rate", "step", *WEIGHTS, *states]
    for name, value in npz.items():
        assert value.dtype == defaults[name].dtype
        assert_allclose(value, defaults[name], rtol=0, atol=0, err_msg=name)
    weights = initializers(mlp())
    for name in WEIGHTS:  # the model's own initial weights, the optimizer's zero moments
        assert_allclose(npz[name], weights[name], rtol=0, atol=0)
    assert npz["learning_rate"] == np.float32(0.001)  # adam's default rate, as fit's
    assert not any(npz[s].any() for s in states)


def test_for_js_writes_the_step_without_defaults_and_the_initial_state(
    model_file: Path, tmp_path: Path
) -> None:
    export(model_file, tmp_path / "step.onnx", "--optimizer", "nesterov", "--lr", "0.05", "--for-js")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step.npz", "step.onnx", "step_init.onnx"]
    step = onnx.load(tmp_path / "step.onnx")
    state_inputs = [i.name for i in step.graph.input][2:]
    assert state_inputs == ["learning_rate", *WEIGHTS, *(f"{w}_velocity" for w in WEIGHTS)]
    assert not {t.name for t in step.graph.initializer} & set(state_inputs)
    init = session(tmp_path / "step_init.onnx")
    assert init.get_inputs() == []
    start = dict(zip([o.name for o in init.get_outputs()], init.run(None, {})))
    with np.load(tmp_path / "step.npz") as saved:
        npz = dict(saved)
    assert list(start) == list(npz) == state_inputs
    for name in npz:
        assert_allclose(start[name], npz[name], rtol=0, atol=0, err_msg=name)
    # the loop of onnxruntime-node: every input fed, starting from the initial-state graph
    expected = trainer_weights(LearningRateSGDNesterov(eta0=0.05, learning_rate="constant"))
    max_diff(loop(session(tmp_path / "step.onnx"), start), expected)


def test_external_data_still_loads_in_onnxruntime(model_file: Path, tmp_path: Path) -> None:
    export(model_file, tmp_path / "step.onnx", "--lr", "0.1", "--external-data")
    data = tmp_path / "step.onnx.data"
    assert data.stat().st_size >= 4 * 16 * 64  # W1 in float32 (tensors under 1 KiB stay inline)
    step = onnx.load(tmp_path / "step.onnx", load_external_data=False)
    external = {t.name for t in step.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert "W1" in external
    state = loop(session(tmp_path / "step.onnx"), {})
    max_diff(state, trainer_weights(LearningRateSGD(0.1, learning_rate="constant")))


def refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(["export-step", *argv]) == 2
    return capsys.readouterr().err.strip()


def test_refusals(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = ["--batch-size", "8", "--out", str(tmp_path / "step.onnx")]
    missing = tmp_path / "missing.onnx"
    assert refusal(capsys, [str(missing), "--loss", "log", *out]) == (
        f"ort-train: error: ONNX model file not found: {missing}"
    )
    assert "invalid choice: 'hinge'" in refusal(capsys, [str(model_file), "--loss", "hinge", *out])
    assert refusal(capsys, [str(model_file), *out]) == (
        f"ort-train: error: {model_file} has no output 'loss': give --loss (one of squared_error, "
        "absolute_error, elastic, log, cross_entropy) to add one"
    )
    assert refusal(capsys, [str(model_file), "--loss", "log", "--momentum", "0.5", *out]) == (
        "ort-train: error: --momentum acts only with --optimizer momentum or nesterov: add one, or leave "
        "--momentum out"
    )
    assert refusal(capsys, [str(model_file), "--loss", "log", "--batch-size", "0", "--out", "x"]).endswith(
        "argument --batch-size: must be an integer > 0, got '0'"
    )
    copy = tmp_path / "model.onnx"
    copy.write_bytes(model_file.read_bytes())
    assert refusal(capsys, [str(copy), "--loss", "log", "--batch-size", "8", "--out", str(copy)]) == (
        f"ort-train: error: export-step would overwrite the model {copy} with {copy}: give another --out"
    )
    assert copy.read_bytes() == model_file.read_bytes()
    assert not list(tmp_path.glob("step*"))


def test_a_graph_without_gradient_is_refused_with_the_exporters_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    onnx.save(mlp(activation="Sin"), tmp_path / "sin.onnx")
    with pytest.raises(GraphNotDifferentiableError) as info:
        export_training_step(add_loss_output(mlp(activation="Sin"), "cross_entropy"), batch_size=BATCH)
    argv = [str(tmp_path / "sin.onnx"), "--loss", "cross_entropy", "--batch-size", "8"]
    err = refusal(capsys, [*argv, "--out", str(tmp_path / "step.onnx")])
    assert "operator Sin" in str(info.value)
    assert err == f"ort-train: error: {' '.join(str(info.value).split())}"
    assert not (tmp_path / "step.onnx").exists()


def test_weights_named_as_savez_arguments(tmp_path: Path) -> None:
    """numpy.savez(f, **arrays) takes ``file`` and ``allow_pickle`` for its own arguments: the
    .npz of a model whose weights bear those names still holds every default."""
    model = mlp()
    renames = {"W1": "file", "B1": "allow_pickle"}
    for init in model.graph.initializer:
        init.name = renames.get(init.name, init.name)
    for node in model.graph.node:
        node.input[:] = [renames.get(x, x) for x in node.input]
    path = tmp_path / "named.onnx"
    onnx.save(model, path)
    out = tmp_path / "step.onnx"
    assert (
        main(["export-step", str(path), "-o", str(out), "--loss", "cross_entropy", "--batch-size", "8"]) == 0
    )
    saved = dict(np.load(tmp_path / "step.npz"))
    values = initializers(model)
    assert_allclose(saved["file"], values["file"])
    assert_allclose(saved["allow_pickle"], values["allow_pickle"])
