"""scikit-learn's parameter protocol without depending on scikit-learn: ``__init__`` stores its
arguments under the same names, and these methods read them back through the signature."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T", bound="ParamsMixin")

#: parameter values that copy.deepcopy returns as they are (immutable)
_ATOMS = (bool, int, float, str, bytes, type(None))


def plain_repr(value: Any) -> str:
    """``repr`` with numpy scalars as the plain values they hold (``0.01``, ``3``, ``'a'``):
    NumPy 2's ``np.float64(0.01)`` in a message or a repr says nothing more, and a parameter
    taken from ``np.logspace`` would otherwise differ in repr from the same float typed in."""
    if isinstance(value, (np.number, np.bool_)):
        return str(value)  # the shortest text that round-trips in the scalar's own precision
    return repr(value.item() if isinstance(value, np.generic) else value)


def same_values(a: Mapping[str, Any] | Sequence[Any], b: Mapping[str, Any] | Sequence[Any]) -> bool:
    """Whether two collections of parameter values hold the same values: dicts with the same
    keys, or sequences of the same length, whose values are the same object, or of the same
    type and equal.

    What a cache of validated or built parameters compares (``get_params()`` dicts, a tuple of
    settings) to tell an unchanged setting from one changed between two fits, also in place.

    Parameters
    ----------
    a, b : dict or sequence
        The two collections.

    Returns
    -------
    bool
        True when every pair is the same. numpy arrays compare by value; a comparison that
        raises (an array inside a tuple, an object refusing ``==``) counts as a difference.
    """
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)) or a.keys() != b.keys():
            return False
        return all(_same_value(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))


def _same_value(x: Any, y: Any) -> bool:
    if x is y:
        return True
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return bool(np.array_equal(np.asarray(x, dtype=object), np.asarray(y, dtype=object)))
    try:
        return type(x) is type(y) and bool(x == y)
    except (ValueError, TypeError):
        return False


@functools.cache
def _signature(init: Any) -> inspect.Signature:
    # inspect.signature costs ~90 us; a fit reads it a dozen times (repr of the learning rate
    # in cache keys, get_params): about 1 ms of a small fit's setup
    return inspect.signature(init)


class ParamsMixin:
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = _signature(cls.__init__)
        return [
            p.name
            for p in sig.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's parameters, as scikit-learn's ``get_params``.

        Parameters
        ----------
        deep : bool, default=True
            Also return the parameters of parameters that have ``get_params`` (a learning
            rate, a loss), as ``<parameter>__<name>``.

        Returns
        -------
        dict of str to object
            The values by parameter name.
        """
        out: dict[str, Any] = {}
        for name in self._param_names():
            value = getattr(self, name)
            out[name] = value
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                for key, sub in value.get_params(deep=True).items():
                    out[f"{name}__{key}"] = sub
        return out

    def set_params(self: T, **params: Any) -> T:
        """Sets constructor parameters, as scikit-learn's ``set_params``.

        Parameters
        ----------
        **params
            New values by parameter name; ``<parameter>__<name>`` sets a parameter of a
            parameter (``learning_rate__eta0=0.01``).

        Returns
        -------
        self
            The object, changed in place.

        Raises
        ------
        ValueError
            For a name that is no parameter, with the list of valid ones.
        """
        valid = self._param_names()
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}; valid ones: {valid}")
            if sub:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
        for name, sub_params in nested.items():
            getattr(self, name).set_params(**sub_params)
        self._on_params_changed()
        return self

    def _on_params_changed(self) -> None:
        """Hook for objects that cache what their parameters build (graphs, sessions)."""

    def clone(self: T) -> T:
        """A new unfitted object with deep copies of the same parameters (numbers, strings and
        None as they are: copy.deepcopy's dispatch took 20 us of each fit's learning rate)."""
        params = self.get_params(deep=False)
        return type(self)(**{k: v if isinstance(v, _ATOMS) else copy.deepcopy(v) for k, v in params.items()})

    def __repr__(self) -> str:
        sig = _signature(type(self).__init__)
        parts = []
        for name in self._param_names():
            value = getattr(self, name)
            default = sig.parameters[name].default
            try:
                same = bool(value == default) if not hasattr(value, "SerializeToString") else False
            except (ValueError, TypeError):
                same = False
            if not same:
                model = hasattr(value, "SerializeToString")
                shown = f"<{type(value).__name__}>" if model else plain_repr(value)
                parts.append(f"{name}={shown}")
        return f"{type(self).__name__}({', '.join(parts)})"
