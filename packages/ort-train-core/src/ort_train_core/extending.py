"""What a package built on ort_train_core needs beyond training: the pieces the scikit-learn and
torch adapters use, public and documented, so that no adapter imports a private module.

* Devices and threads: :class:`Device` (a parsed device string), :func:`cpu_threads` (the
  intra-op threads a session of that much work gets on CPU), :func:`count_weight_values`.
* Sparse and tabular data: :func:`is_sparse`, :func:`check_sparse_structure` (refuses a
  malformed scipy matrix before native code reads it), :func:`sparse_as` (a whole sparse matrix
  densified to a dtype), :func:`dense_rows` (some rows of it densified), :func:`padded_rows`
  (a CSR matrix as the two :class:`PaddedRows` arrays of its padded-row form, which the fit's
  batches make one batch at a time: a graph that gathers weights by column trains in
  O(stored values)),
  :func:`warn_inexact_integers`, :func:`feature_spec` and :func:`check_features` (a graph's
  feature input and the check of a user's ``X`` against it).
* Caches: :class:`LRUCache`, :func:`model_digest` (a key of a model's content, or of its
  structure without some initializers' values), :func:`float_initializers`,
  :func:`keeps_values` and :func:`with_values` (a graph cached by structure given another
  model's values) and :data:`MAX_CACHED_MODEL_BYTES` (larger models are not cached).
* DLPack: :data:`DLPACK_BOOL_AS_UINT8`, whether a bool tensor crosses into onnxruntime as
  uint8 (flagged for :func:`~ort_train_core.ortvalue_from_dlpack`) or as it is.
* Learning rates: :class:`NodeBuilder`, what a subclass's
  :meth:`~ort_train_core.BaseLearningRate.update_nodes` writes its update nodes with.
* Gradient backends: :data:`BACKENDS`, the names a ``backend=`` parameter accepts (besides
  None, the default), for an adapter's own validation.
* Parameters: :func:`same_values`, whether two ``get_params()`` dicts (or tuples of settings)
  hold the same values, for a cache of what they validated or built.
* Metadata: :data:`EPOCH_LOSS_WEIGHTS`, the loss graph's key saying how the trainers weigh each
  batch's loss in the epoch's mean.

A trainer's progress moves between trainers with
:meth:`~ort_train_core.OrtGradientOptimizer.training_state` and
:meth:`~ort_train_core.OrtGradientOptimizer.continue_progress`; per-step work (averaging, learning
rates adapted between epochs) goes in a :class:`~ort_train_core.Callback`.
"""

from __future__ import annotations

from ._backends import BACKENDS
from ._binding import DLPACK_BOOL_AS_UINT8, count_weight_values, cpu_threads
from ._builder import NodeBuilder
from ._cache import (
    MAX_CACHED_MODEL_BYTES,
    LRUCache,
    keeps_values,
    model_digest,
    with_values,
)
from ._data import (
    check_features,
    check_sparse_structure,
    dense_rows,
    feature_spec,
    is_sparse,
    sparse_as,
    warn_inexact_integers,
)
from ._loss_trainer import EPOCH_LOSS_WEIGHTS
from ._padded import PaddedRows, padded_rows
from ._params import same_values
from ._runtime import Device
from .graph import float_initializers

__all__ = [
    "BACKENDS",
    "DLPACK_BOOL_AS_UINT8",
    "EPOCH_LOSS_WEIGHTS",
    "MAX_CACHED_MODEL_BYTES",
    "Device",
    "LRUCache",
    "NodeBuilder",
    "PaddedRows",
    "check_features",
    "check_sparse_structure",
    "count_weight_values",
    "cpu_threads",
    "dense_rows",
    "feature_spec",
    "float_initializers",
    "is_sparse",
    "keeps_values",
    "model_digest",
    "padded_rows",
    "same_values",
    "sparse_as",
    "warn_inexact_integers",
    "with_values",
]
