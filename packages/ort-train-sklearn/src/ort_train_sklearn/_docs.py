"""Docstring entries the estimators share, written once (as scipy's ``doccer`` and MNE's
``fill_doc`` do): a class docstring names a parameter or attribute as a line ``%(name)s`` and
:func:`fill_doc` writes its numpydoc entry there, the default read from the class signature.
An entry is (type, description), or a block of such lines (the parameters of a family)."""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import TypeVar

_T = TypeVar("_T", bound=type)
#: (type, description) of a parameter or attribute, or a block of ``%(name)s`` lines
Entry = tuple[str, str] | str

#: the parameters and fitted attributes several estimators document alike
SHARED_ENTRIES: dict[str, Entry] = {
    "max_iter": ("int", "Epochs (passes over the data) of :meth:`fit`; :meth:`partial_fit` runs one."),
    "tol": (
        "float or None",
        "Training stops once the training loss has not improved by ``tol`` for\n"
        "``n_iter_no_change`` epochs in a row, in scikit-learn's loss scale (with\n"
        "``early_stopping``: once the validation score has not improved by ``tol``, as\n"
        "scikit-learn's); None trains ``max_iter`` epochs. :meth:`partial_fit` ignores it.",
    ),
    "n_iter_no_change": ("int", "Epochs without improvement that stop training (see ``tol``)."),
    "shuffle": ("bool", "Whether to shuffle the rows at each epoch."),
    "random_state": (
        "int, RandomState instance or None",
        "Seeds the random draws: initial weights (where drawn), validation split, shuffling.",
    ),
    "early_stopping": (
        "bool",
        "Whether :meth:`fit` sets ``validation_fraction`` of the rows aside (stratified for a\n"
        "classifier) and stops on their score (accuracy or R², see ``tol``) instead of the\n"
        "training loss; the MLPs and ``OnnxModel*`` then keep the weights of the best epoch,\n"
        "the SGD estimators those of the last, as scikit-learn's. The drop-ins set aside\n"
        "scikit-learn's rows and stop by its rule, but stop at its epoch only where they take its\n"
        "steps in its order: ``shuffle=False``, and for the SGD estimators ``batch_size=1``, no L2\n"
        "share in the penalty, two classes or a regressor (the scikit-learn adapter page says why).",
    ),
    "validation_fraction": ("float", "The share of the rows set aside with ``early_stopping``, in (0, 1)."),
    "warm_start": (
        "bool",
        "Whether :meth:`fit` starts from the fitted weights (as ``coef_`` / ``coefs_`` hold\n"
        "them) instead of new ones. As in scikit-learn, each fit reads the parameters as they\n"
        "are then and starts a new optimisation: the SGD schedule from ``t_ = 1``, the MLP\n"
        "optimizer's state (momentum, Adam's moments) from zero; ``loss_curve_`` goes on.",
    ),
    "verbose": ("int", "0: silent; 1: a progress bar; 2: one line per epoch."),
    "device": ("str", "Where onnxruntime trains: ``'cpu'``, ``'cuda'`` or ``'cuda:N'``."),
    "threads": (
        "int or None",
        "onnxruntime's intra-op threads in every session the estimator makes (training steps,\n"
        "validation, predictions); None: one thread where the work is small (batch x weight\n"
        "values up to 1e7), onnxruntime's default pool above.",
    ),
    "backend": (
        "{'onnx', 'onnxruntime-training'} or None",
        "The gradient backend of the training graphs: ``'onnx'`` (our reverse pass in standard\n"
        "operators, any onnxruntime) or ``'onnxruntime-training'`` (the training build's\n"
        "gradient builder); None: ``$ORT_TRAIN_BACKEND``, else the training build when it is\n"
        "installed, else ``'onnx'``. Checked at :meth:`fit`.",
    ),
    "training": (
        "{'full', 'partial'}",
        "``'full'``: one onnxruntime run per step, of a graph holding the loss, its gradient and\n"
        "the update; ``'partial'``: a forward and a backward run, then loss and update graphs.",
    ),
    "checkpoint_dir": (
        "str, path or None",
        "A folder where :meth:`fit` writes its training state every ``checkpoint_every`` epochs,\n"
        "at the end and on Ctrl-C; :meth:`resume` continues from there. None writes nothing.\n"
        "Not with ``early_stopping`` (the validation scores are not in the checkpoints).",
    ),
    "checkpoint_every": ("int", "Epochs between two checkpoints."),
    "power_t": ("float", "The exponent of ``learning_rate='invscaling'``."),
    "nesterovs_momentum": ("bool", "Whether 'sgd' with momentum takes Nesterov's step."),
    "n_features_in_": ("int", "Number of features seen during :meth:`fit`."),
    "feature_names_in_": (
        "ndarray of shape (`n_features_in_`,)",
        "Names of the features seen during :meth:`fit`, when X has string column names.",
    ),
    "classes_": ("ndarray of shape (n_classes,)", "The class labels, sorted."),
    "n_iter_": ("int", "Epochs run by the last call to :meth:`fit`, :meth:`partial_fit` or :meth:`resume`."),
    "loss_curve_": (
        "list of float",
        "The training objective of each epoch in scikit-learn's loss scale, over every call\n"
        "since the last fit from scratch (warm starts and partial fits extend it).",
    ),
    "best_loss_": ("float or None", "The smallest value of ``loss_curve_``; None with ``early_stopping``."),
    "validation_scores_": (
        "list of float or None",
        "With ``early_stopping``, the validation score of each epoch (accuracy for a\n"
        "classifier, R² for a regressor, weighted by the sample weights), what the stopping\n"
        "rule monitors; None otherwise.",
    ),
    "best_validation_score_": (
        "float or None",
        "The largest value of ``validation_scores_``; None without ``early_stopping``.",
    ),
    "loss_": ("float", "The last value of ``loss_curve_`` (the last epoch's training objective)."),
    "t_": (
        "int",
        "Training samples seen (MLPs: epochs x training rows) or weight updates (SGD:\n"
        "``n_iter_ * n_samples + 1``), over every call since the last fit from scratch, as\n"
        "scikit-learn counts them.",
    ),
    "fit_attributes": (
        "%(n_features_in_)s\n%(feature_names_in_)s\n%(n_iter_)s\n%(loss_curve_)s\n%(loss_)s\n"
        "%(best_loss_)s\n%(validation_scores_)s\n%(best_validation_score_)s\n%(t_)s"
    ),
}

_PLACEHOLDER = re.compile(r"^( *)%\((\w+)\)s$", flags=re.MULTILINE)


def fill_doc(entries: Mapping[str, Entry]) -> Callable[[_T], _T]:
    """A class decorator writing each ``%(name)s`` line of the class docstring as the numpydoc
    entry of ``name``, looked up in ``entries`` then in :data:`SHARED_ENTRIES`; a parameter's
    default is read from the class's ``__init__``.

    Parameters
    ----------
    entries : mapping of str to (str, str) or str
        The entries of the names the class documents its own way.

    Returns
    -------
    callable
        The decorator.
    """

    def decorate(cls: _T) -> _T:
        signature = inspect.signature(cls.__init__).parameters  # type: ignore[misc]

        def fill(text: str) -> str:
            return _PLACEHOLDER.sub(entry, text)

        def entry(match: re.Match[str]) -> str:
            name = match[2]
            value = entries[name] if name in entries else SHARED_ENTRIES[name]
            if isinstance(value, str):
                return textwrap.indent(fill(value), match[1])
            kind, text = value
            if name in signature:
                kind = f"{kind}, default={signature[name].default!r}"
            return textwrap.indent(f"{name} : {kind}\n" + textwrap.indent(text, "    "), match[1])

        cls.__doc__ = fill(cls.__doc__ or "")
        return cls

    return decorate
