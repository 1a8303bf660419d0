"""Random bad input for ``OnnxModule.forward``: the torch network's result or a documented error.

Tensors of random shapes, dtypes, memory layouts and values (NaN, inf, huge) go through an
OnnxModule built from a torch MLP, in training mode (the TrainingAgent graph, then backward), in
eval mode and under ``torch.no_grad()``. Accepted input must give what the torch network itself
gives (the independent reference; NaN where torch has NaN) and exactly what the same values give
as a contiguous tensor, gradients included. Refused input must raise TypeError (dtype, not a
tensor, wrong count) or ValueError (shape) naming the input, never an onnxruntime RuntimeError
and never an output of the wrong shape. Outcomes per kind: :data:`OUTCOMES` (JSON in
``$ROBUSTNESS_REPORT`` when set). Deterministic: ``derandomize=True``, no database.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch_models import onnx_from_torch_mlp, torch_mlp

from ort_train_torch import OnnxModule
from robustness_support import new_outcomes, outcome_report, raised_as_expected, robust_settings

SIZES = [3, 5, 2]
EXAMPLES = 12
OUTCOMES = new_outcomes()

ROBUST = robust_settings(EXAMPLES)


_report_outcomes = outcome_report("torch", OUTCOMES)


@pytest.fixture(scope="module")
def net_and_module() -> tuple[torch.nn.Sequential, OnnxModule]:
    net = torch_mlp(SIZES, seed=3)
    return net, OnnxModule(onnx_from_torch_mlp(net))


@dataclass
class Case:
    kind: str
    inputs: tuple[Any, ...]
    error: type[BaseException] | None = None
    match: str = ""


def _values(shape: tuple[int, ...], special: bool) -> st.SearchStrategy[np.ndarray]:
    elements = (
        st.one_of(st.floats(-4, 4, width=32), st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -3e38]))
        if special
        else st.floats(-4, 4, width=32)
    )
    return hnp.arrays(np.float32, shape, elements=elements)


KINDS = ["values", "layout", "empty", "dtype", "n-features", "rank", "not-a-tensor", "count"]


@st.composite
def cases(draw: st.DrawFn, kind: str, training: bool) -> Case:
    n = draw(st.integers(1, 6))
    f = SIZES[0]
    x = torch.from_numpy(draw(_values((n, f), special=kind == "values")))
    if kind == "values":  # NaN, inf, huge values: propagated as torch propagates them
        return Case(kind, (x,))
    if kind == "layout":
        how = draw(st.sampled_from(["transposed", "strided", "expanded", "flipped"]))
        if how == "transposed":
            xl = x.T.contiguous().T
        elif how == "strided":
            big = torch.zeros(2 * n, 3 * f)
            big[::2, 1::3] = x
            xl = big[::2, 1::3]
        elif how == "expanded":
            xl = x[:1].expand(n, f)
        else:
            xl = x.flip(0)
        return Case(kind, (xl,))
    if kind == "empty":
        empty = torch.zeros(0, f)
        if training:  # onnxruntime's gradient kernels refuse zero rows (Gemm with K=0)
            return Case(kind, (empty,), ValueError, r"^input 0 \('X'\) is empty .* cannot differentiate")
        return Case(kind, (empty,))
    if kind == "dtype":
        dtype = draw(
            st.sampled_from(
                [
                    *(torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64),
                    *(torch.bool, torch.uint8, torch.complex64),
                ]
            )
        )
        return Case(kind, (x.to(dtype),), TypeError, r"^input 0 \('X'\) must be torch.float32, got torch\.")
    if kind == "n-features":
        k = draw(st.integers(0, 2 * f).filter(lambda k: k != f))
        return Case(
            kind,
            (torch.zeros(n, k),),
            ValueError,
            rf"^input 0 \('X'\) has shape \({n}, {k}\) but the model expects \(\?, {f}\)",
        )
    if kind == "rank":
        shape = draw(st.sampled_from([(), (f,), (n,), (1, n, f), (n, f, 1)]))
        return Case(kind, (torch.zeros(shape),), ValueError, r"^input 0 \('X'\) has shape .* expects")
    if kind == "not-a-tensor":
        value = draw(st.sampled_from([x.numpy(), x.tolist(), None, 1.0]))
        return Case(kind, (value,), TypeError, r"^input 0 \('X'\) must be a torch.Tensor")
    k = draw(st.sampled_from([0, 2, 3]))
    return Case(kind, (x,) * k, TypeError, rf"^OnnxModule.forward takes 1 tensor\(s\) \['X'\], got {k}")


def _forward(module: OnnxModule, mode: str, inputs: tuple[Any, ...]) -> torch.Tensor:
    module.train(mode == "train")
    if mode == "no_grad":
        with torch.no_grad():
            return module(*inputs)  # type: ignore[no-any-return]
    return module(*inputs)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["train", "eval", "no_grad"])
def test_forward_on_random_input(net_and_module: Any, mode: str, kind: str) -> None:
    net, module = net_and_module

    @ROBUST
    @given(case=cases(kind, training=mode == "train"))
    def run(case: Case) -> None:
        module.zero_grad()
        error: BaseException | None = None
        try:
            out = _forward(module, mode, case.inputs)
        except (TypeError, ValueError) as exc:
            error = exc
        OUTCOMES[f"{mode} {case.kind}"].update(["ok" if error is None else type(error).__name__])
        if raised_as_expected(case, error):
            return
        (x,) = case.inputs
        with torch.no_grad():
            expected = net(x)
        assert out.shape == expected.shape
        # NaN where torch has NaN, inf where torch has inf; the MLP's float32 sums may differ in
        # the last bits
        torch.testing.assert_close(out.detach(), expected, equal_nan=True, atol=1e-5, rtol=1e-5)
        # exactly what the same values give as a fresh contiguous tensor, gradients included
        if mode == "train":
            out.sum().backward()
            grads = [p.grad.clone() for p in module.parameters()]  # type: ignore[union-attr]
            module.zero_grad()
        same = _forward(module, mode, (x.contiguous().clone(),))
        torch.testing.assert_close(out.detach(), same.detach(), equal_nan=True, atol=0, rtol=0)
        if mode == "train":
            same.sum().backward()
            for g, p in zip(grads, module.parameters()):
                torch.testing.assert_close(g, p.grad, equal_nan=True, atol=0, rtol=0)

    run()


def test_backward_of_a_non_contiguous_input_matches_torch(net_and_module: Any) -> None:
    """The input gradient of a transposed (non-contiguous) input: torch's, in torch's layout."""
    net, module = net_and_module
    module.train()

    @ROBUST
    @given(values=_values((SIZES[0], 5), special=False))
    def run(values: np.ndarray) -> None:
        x_ours = torch.from_numpy(values).T.requires_grad_(True)
        x_ref = torch.from_numpy(values.copy()).T.requires_grad_(True)
        assert not x_ours.is_contiguous()
        module(x_ours).square().sum().backward()
        net(x_ref).square().sum().backward()
        assert x_ours.grad is not None
        assert x_ref.grad is not None
        torch.testing.assert_close(x_ours.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
        OUTCOMES["train backward non-contiguous"].update(["ok"])
        net.zero_grad()
        module.zero_grad()

    run()


# ---- the model itself: bytes and files that are not ONNX ------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [b"", b"not an onnx model", b"\x08\x07", bytes(range(200))],
    ids=["empty", "text", "ir-only", "binary"],
)
def test_bytes_that_are_not_a_model(payload: bytes) -> None:
    with pytest.raises(ValueError, match=r"^model_onnx: the bytes are not a valid ONNX model"):
        OnnxModule(payload)


def test_truncated_file(tmp_path: Path) -> None:
    data = onnx_from_torch_mlp(torch_mlp(SIZES)).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.onnx is not a valid ONNX model"):
        OnnxModule(path)
    with pytest.raises(FileNotFoundError, match=r"missing\.onnx"):
        OnnxModule(tmp_path / "missing.onnx")


def test_file_with_external_data_outside_its_folder(tmp_path: Path) -> None:
    import onnx

    model = onnx_from_torch_mlp(torch_mlp(SIZES))
    inner = tmp_path / "inner"
    inner.mkdir()
    onnx.save_model(
        model, str(inner / "m.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0
    )
    saved = onnx.load(str(inner / "m.onnx"), load_external_data=False)
    for tensor in saved.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../w.bin"
    (inner / "m.onnx").write_bytes(saved.SerializeToString())
    (tmp_path / "w.bin").write_bytes((inner / "w.bin").read_bytes())
    with pytest.raises(ValueError, match=r"external data location '\.\./w\.bin'"):
        OnnxModule(inner / "m.onnx")
