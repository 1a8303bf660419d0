"""One bounded cache for what is costly to build and the same for equal keys: onnxruntime
sessions (by graph bytes and options) and fused step graphs (by model content and settings)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from onnx import ModelProto

V = TypeVar("V")

#: models larger than this (serialised bytes) are not kept in the graph caches: those save the
#: setup of small fits (milliseconds), while each entry holds copies of the model's weights
#: (about 4 times its size), and a model's random initial weights make most keys new
MAX_CACHED_MODEL_BYTES = 1 << 20


def model_digest(model: ModelProto) -> bytes:
    """sha256 of the serialised model: equal for equal content, whatever the object.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (graph, initializers, opsets and metadata all count).

    Returns
    -------
    bytes
        The 32-byte digest.
    """
    return hashlib.sha256(model.SerializeToString()).digest()


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
        entries = self._entries
        if key in entries:
            entries.move_to_end(key)
            return entries[key]
        value = build()
        entries[key] = value
        if len(entries) > self.maxsize:
            entries.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forgets every entry."""
        self._entries.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
