"""ort-train's own reverse pass: gradients written in default-domain ONNX operators, so that
stock onnxruntime (any version, platform and execution provider) trains.

- :mod:`._walk`: the reverse walk over a static-shape graph (knows no operator by name);
- :mod:`._context`: what a rule reads and writes with;
- :mod:`.rules`: the rules, one module per operator family;
- :mod:`.backend`: :class:`~.backend.OnnxBackend`, the ``backend="onnx"`` of the trainers.
"""

from ._context import RULES

__all__ = ["RULES"]
