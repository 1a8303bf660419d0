"""The gradient rules, one module per operator family; importing this package registers them
all in :data:`.._context.RULES`."""

from . import conv, elementwise, linalg, norm, recurrent, reduce, resize, shape

__all__ = ["conv", "elementwise", "linalg", "norm", "recurrent", "reduce", "resize", "shape"]
