"""OnnxModule warns, as the core trainers do, when a torch export merged parameters of equal
values into one tensor (issue 17, item 8): here the two fresh LayerNorms of a block exported
in eval mode, tied through an Identity node."""

from __future__ import annotations

import io
import warnings

import onnx
import pytest
import torch
from torch import nn

from ort_train_core import ExportedGraphWarning
from ort_train_core.graph import MAX_IR_VERSION
from ort_train_torch import OnnxModule


class TwoNorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm1, self.norm2 = nn.LayerNorm(4), nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm2(torch.relu(self.lin(self.norm1(x))))


def _export(training: bool) -> onnx.ModelProto:
    net = TwoNorms().train(training)
    buffer = io.BytesIO()
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (torch.randn(2, 4),),
            buffer,
            dynamo=False,
            input_names=["X"],
            output_names=["Y"],
            dynamic_axes={"X": {0: "N"}, "Y": {0: "N"}},
            opset_version=18,
            training=mode,
            do_constant_folding=not training,
        )
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


def test_onnx_module_warns_about_merged_parameters() -> None:
    model = _export(training=False)
    assert "Identity" in {n.op_type for n in model.graph.node}  # the exporter tied them
    with pytest.warns(
        ExportedGraphWarning, match=r"OnnxModule: .*'norm1\.weight' is read as .*norm2\.weight"
    ):
        OnnxModule(model)


def test_onnx_module_of_a_one_to_one_export_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportedGraphWarning)
        module = OnnxModule(_export(training=True))
    assert len(list(module.parameters())) == 6


class GroupNormCNN(nn.Module):
    """Convolutions normalised by GroupNorm and InstanceNorm: no BatchNorm was ever there."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.norm1 = nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8)
        self.conv2, self.norm2 = nn.Conv2d(8, 4, 3, padding=1), nn.InstanceNorm2d(4, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm2(self.conv2(torch.relu(self.norm1(self.conv1(x))))).mean(dim=(2, 3))


@pytest.mark.parametrize("dynamo", [False, True])
def test_a_groupnorm_cnn_is_not_told_its_batchnorm_was_folded(dynamo: bool) -> None:
    """The 'Conv and no BatchNormalization' note fired on every GroupNorm/InstanceNorm CNN (issue
    26 item 12's architectures): a graph normalised otherwise gets no such warning."""
    if dynamo:
        pytest.importorskip("onnxscript")
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = (
            {} if dynamo else {"training": torch.onnx.TrainingMode.TRAINING, "do_constant_folding": False}
        )
        torch.onnx.export(
            GroupNormCNN(), (torch.randn(2, 3, 6, 6),), buffer, dynamo=dynamo, opset_version=18, **kwargs
        )
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        OnnxModule(model)
    notes = [str(w.message) for w in caught if issubclass(w.category, ExportedGraphWarning)]
    assert not any("no BatchNormalization" in note for note in notes), notes
