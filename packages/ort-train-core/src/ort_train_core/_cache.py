"""One bounded cache for what is costly to build and the same for equal keys: onnxruntime
sessions (by graph bytes and options) and fused step graphs (by model content and settings).

A graph record, a loss graph or a forward/backward pair depends on a model's structure, not on
the values of the weights it trains (those are fed to the steps): such caches are keyed by
:func:`model_digest` without those values, and a hit takes the new model's values
(:func:`with_values`), so that a refit from other initial weights builds nothing again."""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable
from typing import Any, Generic, TypeVar

from onnx import ModelProto

V = TypeVar("V")
#: what a lookup finds for a key it does not hold (None may be an entry)
_ABSENT = object()

#: models larger than this (serialised bytes) are not kept in the graph caches: those save the
#: setup of small fits (milliseconds), while each entry holds copies of the model's weights
#: (about 4 times its size)
MAX_CACHED_MODEL_BYTES = 1 << 20


#: the fields of a TensorProto that hold its values (its name, type, shape and storage stay)
_VALUE_FIELDS = ("raw_data", "float_data", "double_data", "int32_data", "int64_data", "uint64_data")


def model_digest(model: ModelProto, without_values: Collection[str] = ()) -> bytes:
    """sha256 of the serialised model: equal for equal content, whatever the object.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (graph, initializers, opsets and metadata all count).
    without_values : collection of str, default=()
        Initializers whose values do not count (their names, element types and shapes do):
        the weights a graph built from the model takes as inputs.

    Returns
    -------
    bytes
        The 32-byte digest.
    """
    if not without_values:
        return hashlib.sha256(model.SerializeToString()).digest()
    names = set(without_values)
    out = ModelProto()
    out.CopyFrom(model)
    for tensor in out.graph.initializer:
        if tensor.name in names:
            for field in _VALUE_FIELDS:
                tensor.ClearField(field)
    return hashlib.sha256(out.SerializeToString()).digest()


def keeps_values(source: ModelProto, built: ModelProto, names: Collection[str]) -> bool:
    """Whether every initializer ``names`` of ``source`` is in ``built`` unchanged: a graph
    built from ``source`` that a hit of another model's values may reuse (:func:`with_values`).

    Parameters
    ----------
    source, built : onnx.ModelProto
        A model and a graph built from it.
    names : collection of str
        The initializers a hit would take from another model.

    Returns
    -------
    bool
        False when a name is missing from either or its tensor differs (a build that renamed,
        cast or folded it).
    """
    mine = {t.name: t for t in source.graph.initializer if t.name in names}
    theirs = {t.name: t for t in built.graph.initializer if t.name in names}
    return len(mine) == len(theirs) == len(set(names)) and all(mine[n] == theirs[n] for n in mine)


def with_values(model: ModelProto, source: ModelProto, names: Collection[str]) -> ModelProto:
    """A copy of ``model`` whose initializers ``names`` are those of ``source``.

    Parameters
    ----------
    model : onnx.ModelProto
        A cached graph (not modified).
    source : onnx.ModelProto
        The model whose values the copy takes; each name must be one of its initializers, of the
        same element type and shape (same :func:`model_digest` without their values).
    names : collection of str
        The initializers to take.

    Returns
    -------
    onnx.ModelProto
        The copy.
    """
    wanted = set(names)
    values = {t.name: t for t in source.graph.initializer if t.name in wanted}
    out = ModelProto()
    out.CopyFrom(model)
    for tensor in out.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(values[tensor.name])
    return out


class LRUCache(Generic[V]):
    """A mapping of at most ``maxsize`` entries that forgets the least recently used first.

    Parameters
    ----------
    maxsize : int
        How many entries it keeps.

    Attributes
    ----------
    maxsize : int
        How many entries it keeps.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        # fits on several threads share the caches: a lookup's move_to_end must not meet
        # another thread's eviction of the same key (the builds run outside the lock)
        self._lock = threading.Lock()
        _INSTANCES.add(self)

    def get_or_build(self, key: Hashable, build: Callable[[], V]) -> V:
        """The entry of ``key``, built by ``build()`` and kept when absent.

        Parameters
        ----------
        key : hashable
            What identifies the entry.
        build : callable
            Makes the entry; an exception it raises leaves the cache unchanged.

        Returns
        -------
        object
            The cached or new entry.
        """
        with self._lock:
            found = self._entries.get(key, _ABSENT)
            if found is not _ABSENT:
                self._entries.move_to_end(key)
                return found  # type: ignore[return-value]
        return self.put(key, build())

    def put(self, key: Hashable, value: V) -> V:
        """Keeps ``value`` as the entry of ``key`` (replacing any), the most recently used.

        Parameters
        ----------
        key : hashable
            What identifies the entry.
        value : object
            The entry.

        Returns
        -------
        object
            ``value``.
        """
        with self._lock:
            entries = self._entries
            entries[key] = value
            entries.move_to_end(key)
            if len(entries) > self.maxsize:
                entries.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forgets every entry."""
        with self._lock:
            self._entries.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)


#: every cache made, for :func:`clear_caches`
_INSTANCES: weakref.WeakSet[LRUCache[Any]] = weakref.WeakSet()


def clear_caches() -> None:
    """Empties every :class:`LRUCache` of the process (graphs, records, sessions): the next fit
    of any architecture builds everything again, as the first one of a process does (the
    benchmarks' cold fits)."""
    for cache in list(_INSTANCES):
        cache.clear()
