"""The ``ort-train`` command: inspect, train and evaluate ONNX files without writing Python.

Exit codes: 0 success; 1 training failed (the loss diverged, onnxruntime failed); 2 bad usage or
bad input (the message goes to stderr, without a traceback); 130 interrupted by Ctrl-C; 141 the
reader of the output closed it (``| head``), as a process that SIGPIPE ends.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shlex
import sys
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import ModelProto, helper

from ._backends import BACKEND_VARIABLE, BACKENDS, get_backend
from ._batchnorm import running_statistics
from ._data import DataSpec, check_fit_arrays, feature_spec
from ._exported import export_notes, exporter_constants
from ._io import check_regular_file, load_model
from ._npz import read_npz, write_npz
from .callbacks import Callback, EpochPrinter, ProgressBar
from .checkpoint import CHECKPOINT_FILE, check_writable_folder, write_atomically
from .exceptions import (
    CheckpointMismatchError,
    ConvergenceError,
    ConvergenceWarning,
    CudaUnavailableError,
    TrainingInterruptedWarning,
)
from .graph import (
    add_loss_output,
    default_weights_to_train,
    differentiable_ancestors,
    float_initializers,
    get_metadata,
    initializers_to_inputs,
    normalise_model,
    nothing_to_train_error,
    set_batch_dimension,
)
from .learning_rate import BaseLearningRate, LearningRateAdam, LearningRateSGD, LearningRateSGDNesterov

if TYPE_CHECKING:  # imported when fit runs: the other commands do not need it
    from ._fit_loop import BaseOrtTrainer
    from .optimizer import OrtGradientOptimizer

EXIT_OK, EXIT_TRAINING_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
#: 128 + SIGPIPE, what a shell reports for a command whose reader closed the pipe
EXIT_BROKEN_PIPE = 141

LOSSES = ("squared_error", "absolute_error", "elastic", "log", "cross_entropy")
CLASSIFICATION_LOSSES = ("log", "cross_entropy")
OPTIMIZERS = ("sgd", "nesterov", "adam")
#: export-step's: fit's and SGD with (non-Nesterov) momentum
STEP_OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam")

EPILOG = """\
examples:
  ort-train inspect model.onnx
  ort-train fit model.onnx --data train.csv --target y --epochs 50 --lr 0.01 --out trained.onnx
  ort-train fit mlp.onnx --data train.npz --target y --optimizer adam --lr 1e-3 --batch-size 32 \\
      --validation-fraction 0.2 --early-stopping --checkpoint ckpt/ --out trained.onnx
  ort-train fit mlp.onnx ... --checkpoint ckpt/ --resume     # continue an interrupted run
  ort-train eval trained.onnx --data test.csv --target y
  ort-train eval clf.onnx --data test.csv --target label --loss cross_entropy
  ort-train export-step mlp.onnx --loss cross_entropy --batch-size 32 --out step.onnx

data files: a .csv with a header row (numbers only) or an .npz; the target is the column (or
array) --target, the features every other column (in file order), or the .npz array 'X'.
Inputs of other ranks or types (images, int64 ids, masks) and several inputs: an .npz with one
array per model input, named after it (np.savez('d.npz', input_ids=ids, attention_mask=m, y=y)).
exit codes: 0 success, 1 training failed (diverged), 2 bad usage or input, 130 interrupted,
141 the output's reader closed the pipe (| head).
"""


class _UsageError(ValueError):
    """Bad input found after parsing: exit code 2 like argparse's own errors."""


# ---- argument types ----------------------------------------------------------------------------
def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be an integer > 0, got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``ort-train`` command and its subcommands ``inspect``, ``fit``, ``eval``,
    ``export-step``.

    Returns
    -------
    argparse.ArgumentParser
        Each subcommand sets ``func``, the function that runs it.
    """
    parser = argparse.ArgumentParser(
        prog="ort-train",
        description="Train ONNX graphs with onnxruntime-training.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{inspect,fit,eval,export-step}")

    p = sub.add_parser(
        "inspect",
        help="inputs, outputs, trainable weights, and whether a gradient can be built",
        epilog="example: ort-train inspect model.onnx",
    )
    p.add_argument("model", help="an ONNX prediction graph")
    p.add_argument("--output-index", type=int, default=0, help="the output to differentiate (default 0)")
    _backend_argument(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "fit",
        help="train a prediction graph on a .csv or .npz file",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="an ONNX prediction graph; the loss is added by --loss")
    _data_arguments(p)
    _training_arguments(p)
    _output_arguments(p)
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser(
        "eval",
        help="loss and metrics of a prediction graph on a .csv or .npz file",
        epilog=EVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="an ONNX prediction graph")
    _data_arguments(p)
    p.set_defaults(func=cmd_eval)
    _export_step_parser(sub)
    return parser


EVAL_EPILOG = """\
regression losses report loss, mse, mae and r2; --loss log (probabilities) or
cross_entropy (logits) report loss, accuracy and log_loss.
example: ort-train eval trained.onnx --data test.csv --target y
"""
EXPORT_STEP_EPILOG = """\
the step's contract: feed the batch and the labels; each output <name>_new is the next step's
input <name>; every other input has its initial value as a default (also in STEP.npz).
examples:
  ort-train export-step mlp.onnx --loss cross_entropy --optimizer adam --lr 1e-3 \\
      --batch-size 32 --out step.onnx
  ort-train export-step mlp.onnx --loss cross_entropy --batch-size 32 --out web/step.onnx --for-js
"""
#: a step over this size (serialized) is written with its initializers as external data:
#: protobuf cannot write a model over 2 GiB in one file
EXTERNAL_DATA_BYTES = 1 << 30


def _export_step_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The subcommand ``export-step``: its options, as ``fit``'s where they mean the same."""
    p = sub.add_parser(
        "export-step",
        help="write one training step as a standard ONNX graph that any onnxruntime runs",
        epilog=EXPORT_STEP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="an ONNX prediction graph (or one with a 'loss' output, without --loss)")
    p.add_argument(
        "--out",
        "-o",
        required=True,
        metavar="STEP.onnx",
        help="the step to write; its state goes to STEP.npz",
    )
    p.add_argument("--loss", choices=LOSSES, default=None, help="the loss to add (default: the graph's own)")
    p.add_argument("--output-index", type=int, default=0, help="the model output the loss reads (default 0)")
    p.add_argument("--optimizer", choices=STEP_OPTIMIZERS, default="sgd", help="update rule (default sgd)")
    p.add_argument(
        "--lr", type=_positive_float, default=None, help="learning rate (default 0.01; 0.001 for adam)"
    )
    p.add_argument(
        "--momentum",
        type=float,
        default=None,
        help="with --optimizer momentum or nesterov: its momentum (default 0.9)",
    )
    p.add_argument(
        "--batch-size", type=_positive_int, required=True, help="rows per step (fixed in the graph)"
    )
    p.add_argument("--weights", nargs="+", default=None, metavar="W", help="the initializers to train")
    p.add_argument("--sample-weight", action="store_true", help="the step takes an input 'sample_weight'")
    p.add_argument(
        "--external-data",
        action="store_true",
        help="write the tensors to STEP.onnx.data (and STEP_init.onnx.data); done anyway over 1 GiB",
    )
    p.add_argument(
        "--for-js",
        action="store_true",
        help=(
            "for onnxruntime-node/web, which cannot feed an input that has a default: the step "
            "without defaults, and STEP_init.onnx whose outputs are the initial state"
        ),
    )
    p.set_defaults(func=cmd_export_step)


def _training_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``fit`` that decide the training: optimizer, rates, epochs, batches,
    validation and early stopping, shuffling."""
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help="update rule (default sgd)")
    p.add_argument(
        "--lr", type=_positive_float, default=None, help="learning rate (default 0.01; 0.001 for adam)"
    )
    p.add_argument(
        "--momentum", type=float, default=None, help="with --optimizer nesterov: its momentum (default 0.9)"
    )
    p.add_argument("--epochs", type=_positive_int, default=100, help="epochs in all (default 100)")
    p.add_argument("--batch-size", type=_positive_int, default=10, help="rows per step (default 10)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument(
        "--validation-fraction",
        type=_fraction,
        default=None,
        help="hold out this fraction of the rows (drawn with --seed) for a validation loss",
    )
    p.add_argument(
        "--early-stopping",
        action="store_true",
        help="stop when the (validation) loss has not improved by --tol for --patience epochs",
    )
    p.add_argument(
        "--tol", type=float, default=None, help="with --early-stopping: its tolerance (default 1e-4)"
    )
    p.add_argument(
        "--patience", type=_positive_int, default=None, help="with --early-stopping: its epochs (default 5)"
    )
    p.add_argument(
        "--shuffle", action=argparse.BooleanOptionalAction, default=True, help="shuffle each epoch"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffling and the split (default 0)")
    _backend_argument(p)


def _backend_argument(p: argparse.ArgumentParser) -> None:
    """``--backend``: the gradient backend (the trainers' and the estimators' ``backend=``)."""
    p.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default=None,
        help=(
            "the gradient backend: onnx (standard operators, any onnxruntime) or onnxruntime-training "
            f"(default: ${BACKEND_VARIABLE}, else onnxruntime-training when installed, else onnx)"
        ),
    )


def _output_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``fit`` that decide what it writes: the model, the checkpoints, the progress."""
    p.add_argument("--out", required=True, help="where to write the trained prediction graph (.onnx)")
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help=f"write DIR/{CHECKPOINT_FILE} after every epoch (and on Ctrl-C)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=_positive_int,
        default=None,
        metavar="K",
        help="with --checkpoint: every K epochs instead (and at the end, and on Ctrl-C)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help=(
            "continue from the --checkpoint up to --epochs in all; another --data (every value is "
            "checked), --batch-size, --shuffle or --seed than the checkpoint's is refused"
        ),
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress: a bar on a terminal, else (a log, CI, a pipe) one line per epoch on stderr",
    )


def _data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data", required=True, help="a .csv with a header row (numbers only, no comment lines), or an .npz"
    )
    p.add_argument("--target", required=True, help="the target column (or .npz array)")
    p.add_argument("--loss", choices=LOSSES, default="squared_error", help="default squared_error")
    p.add_argument("--output-index", type=int, default=0, help="the model output the loss reads (default 0)")


# ---- data ----------------------------------------------------------------------------------------
def load_table(
    path: str, target: str, inputs: Sequence[str] | None = None
) -> tuple[np.ndarray | dict[str, np.ndarray], np.ndarray, list[str]]:
    """The features and the target of a data file.

    Parameters
    ----------
    path : str
        A ``.csv`` with a header row (numbers only), or an ``.npz``.
    target : str
        The target's column (or array); the features are every other column (in file order),
        or the ``.npz`` array ``'X'`` when there is one.
    inputs : sequence of str, optional
        The model's batched inputs. An ``.npz`` holding an array named after each of them
        feeds them by name (any rank and type: images, int64 ids, masks); a model with several
        inputs needs such an ``.npz``.

    Returns
    -------
    X : ndarray or dict of str to ndarray
        The features, one row per sample; a dict by input name when the ``.npz`` names the
        inputs.
    y : ndarray
        The target.
    names : list of str
        The features' names.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    ValueError
        Another suffix, a missing or repeated column, a value that is not a number, no rows.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(2, f"data file not found: {path}", path)
    check_regular_file(path, "data file")  # a FIFO would block the read, /dev/zero never end
    suffix = os.path.splitext(path)[1].lower()
    names = list(inputs or ())
    if suffix == ".npz":
        return _load_npz(path, target, names)
    if len(names) > 1:
        raise _UsageError(
            f"the model has {len(names)} inputs {names}; a {suffix or 'table'} holds one feature table: give "
            f"an .npz with one array per input named after it and the target (np.savez(path, "
            + ", ".join(f"{n}=..." for n in names)
            + f", {target}=...))"
        )
    if suffix == ".csv":
        return _load_csv(path, target)
    raise _UsageError(
        f"{path}: data files are .csv (with a header row) or .npz, not {suffix or 'no suffix'!r}"
    )


def _load_npz(
    path: str, target: str, inputs: list[str]
) -> tuple[np.ndarray | dict[str, np.ndarray], np.ndarray, list[str]]:
    arrays = read_npz(path)  # headers checked against the real bytes: no allocation from a claim
    if target not in arrays:
        raise _UsageError(f"{path} has no array {target!r}; arrays: {sorted(arrays)}")
    y = arrays.pop(target)
    if y.ndim == 0:
        raise _UsageError(f"{path}: the target {target!r} is a single value, not one value per row")
    if inputs and all(name in arrays for name in inputs):
        # arrays named after the inputs: fed as they are (fit checks ranks, types, rows)
        named = {name: np.asarray(arrays[name]) for name in inputs}
        return (named[inputs[0]] if len(inputs) == 1 else named), y, list(inputs)
    if len(inputs) > 1:
        missing = [name for name in inputs if name not in arrays]
        raise _UsageError(
            f"the model has {len(inputs)} inputs {inputs}; {path} needs one array named after each "
            f"(missing {missing}; arrays: {sorted(arrays)})"
        )
    if "X" in arrays:
        X = np.asarray(arrays["X"])
        if X.ndim == 1:
            X = X[:, None]
        return X, y, [f"X[{j}]" for j in range(X.shape[1] if X.ndim == 2 else 0)]
    if not arrays:
        raise _UsageError(f"{path} holds only the target {target!r}: no features")
    bad = [k for k, v in arrays.items() if v.ndim != 1 or len(v) != len(y)]
    if bad:
        raise _UsageError(
            f"{path}: without an array 'X', every array is a feature column of {len(y)} rows; {bad} are not"
        )
    return np.column_stack(list(arrays.values())), y, list(arrays)


def _load_csv(path: str, target: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    # utf-8-sig: spreadsheets start the file with a byte-order mark, which would otherwise
    # become part of the first column's name
    with open(path, newline="", encoding="utf-8-sig") as f:
        try:
            header = next(csv.reader(f), None)
            names = [h.strip() for h in header or ()]
            _check_header(path, names, target)
            with warnings.catch_warnings():  # no rows: refused below with the file's name
                warnings.filterwarnings("ignore", "loadtxt: input contained no data")
                # comments=None: loadtxt's '#' would drop a row starting with '#N/A' unseen
                table = np.loadtxt(f, delimiter=",", ndmin=2, dtype=np.float64, comments=None)
        except UnicodeDecodeError as exc:
            raise _UsageError(
                f"{path} is not UTF-8 text (it holds the byte {exc.object[exc.start]:#04x}); save it as UTF-8"
            ) from exc
        except _UsageError:
            raise
        except ValueError as exc:
            raise _UsageError(f"{path}: {_csv_problem(path, names) or exc}") from exc
    if table.shape[0] == 0:
        raise _UsageError(f"{path} has a header but no rows")
    if table.shape[1] != len(names):
        raise _UsageError(f"{path}: the header names {len(names)} columns, the rows hold {table.shape[1]}")
    t = names.index(target)
    features = [j for j in range(len(names)) if j != t]
    return table[:, features], table[:, t], [names[j] for j in features]


def _csv_problem(path: str, names: list[str]) -> str | None:
    """The first row that numpy.loadtxt refused, by file line (the header is line 1) and column:
    a value that is not a number, or a row of another length (numpy counts data rows from 0
    and advises ``usecols``). Read again only on failure, split as loadtxt splits (no quotes)."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        next(f, None)
        for line_no, line in enumerate(f, start=2):
            text = line.rstrip("\r\n")
            if not text:  # loadtxt skips empty lines
                continue
            values = text.split(",")
            if len(values) != len(names):
                return f"line {line_no} holds {len(values)} values but the header names {len(names)} columns"
            for name, value in zip(names, values):
                try:
                    float(value)
                except ValueError:
                    where = f"line {line_no}, column {name!r}"
                    return f"{where}: {value.strip()!r} is not a number; fill or drop the missing values"
    return None


def _check_header(path: str, names: list[str], target: str) -> None:
    """The header names the target once and every column once: a repeated name (the target
    again among the features) would silently train on the wrong columns."""
    if not names:
        raise _UsageError(f"{path} is empty; a .csv needs a header row")
    repeated = sorted(n for n, k in Counter(names).items() if k > 1)
    if repeated:
        raise _UsageError(f"{path}: duplicate column names {repeated}; give every column its own name")
    if target not in names:
        raise _UsageError(f"{path} has no column {target!r}; columns: {names}")
    if len(names) < 2:
        raise _UsageError(f"{path} holds only the target {target!r}: no features")


# ---- commands ------------------------------------------------------------------------------------
def _load(path: str) -> ModelProto:
    model = load_model(path)
    if not model.graph.output:
        raise _UsageError(f"{path}: the graph has no output")
    return model


def _output_name(model: ModelProto, index: int) -> str:
    outputs: list[str] = [o.name for o in model.graph.output]
    if not 0 <= index < len(outputs):
        raise _UsageError(f"--output-index {index}: the graph has outputs {outputs}")
    return outputs[index]


def _type_text(vi: onnx.ValueInfoProto) -> str:
    if not vi.type.HasField("tensor_type"):
        return str(helper.printable_type(vi.type))
    tt = vi.type.tensor_type
    if tt.elem_type == onnx.TensorProto.STRING:
        dtype = "string"  # numpy would say 'object'
    else:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name if tt.elem_type else "?"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    return f"{dtype} [{', '.join(dims)}]"


def _batched_inputs(model: ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def input_problem(model: ModelProto) -> str | None:
    """Why ``fit`` and ``eval`` cannot feed the graph's inputs, or None.

    They feed numeric tensors: the features of a .csv or .npz (cast to a float input's type),
    or, for inputs of other ranks or types (images, int64 ids, boolean masks) and for several
    inputs, the .npz arrays named after the inputs. A string or non-tensor input passes the
    gradient check (nothing is differentiated through it) and would fail in onnxruntime at the
    first step with "Unexpected input data type".

    Parameters
    ----------
    model : onnx.ModelProto
        The prediction graph.

    Returns
    -------
    str or None
        The problem and its fix, or None when the inputs can be fed.
    """
    for vi in _batched_inputs(model):
        if not vi.type.HasField("tensor_type"):
            return (
                f"input {vi.name!r} is a {helper.printable_type(vi.type)}, not a tensor; ort-train feeds "
                "numeric arrays: export the model with a tensor input"
            )
        elem = vi.type.tensor_type.elem_type
        if elem == onnx.TensorProto.STRING:
            return (
                f"input {vi.name!r} holds strings ({_type_text(vi)}); ort-train feeds numbers from a .csv "
                "or .npz: encode the strings as numbers before the model (one-hot or ordinal codes) and "
                "export the graph from its first numeric value on"
            )
        dtype = helper.tensor_dtype_to_np_dtype(elem) if elem else np.dtype(np.float32)
        if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer) or dtype == np.bool_):
            return (
                f"input {vi.name!r} takes {_type_text(vi)}; ort-train feeds real numbers, integers and "
                "booleans: give the graph an input of one of those types and Cast it inside"
            )
    return None


def _refuse_unfeedable_inputs(path: str, model: ModelProto) -> None:
    problem = input_problem(model)
    if problem is not None:
        raise _UsageError(f"{path}: {problem}")


def gradient_status(
    model: ModelProto, output_index: int = 0, backend: str | None = None
) -> tuple[list[str], str | None]:
    """Whether a gradient graph can be built for the squared error of an output.

    Parameters
    ----------
    model : onnx.ModelProto
        The prediction graph.
    output_index : int, default=0
        The output to differentiate.
    backend : str or None, default=None
        The gradient backend that tries (None: the default, see :func:`._backends.get_backend`).

    Returns
    -------
    weights : list of str
        The float initializers the output depends on through values with a gradient.
    reason : str or None
        None when the gradient graph can be built, else why not (the blocking operators).
    """
    gradients = get_backend(backend)  # an unknown name is the caller's error, not the graph's
    output = _output_name(model, output_index)
    weights = default_weights_to_train(model, output)
    if not weights:
        return [], str(nothing_to_train_error(model, output))
    problem = input_problem(model)
    if problem is not None:
        return weights, problem
    try:
        loss_model = _fixed_batch(add_loss_output(normalise_model(model), output_index=output_index))
        gradients.gradient_graph(initializers_to_inputs(loss_model, weights), "loss", weights)
    except (ValueError, TypeError) as exc:  # GraphNotDifferentiableError is a ValueError
        return weights, str(exc)
    return weights, None


def _fixed_batch(model: ModelProto, batch: int = 2) -> ModelProto:
    """``model`` with the free first dimension of its inputs fixed, as ``fit`` fixes it to the
    batch size: the onnx backend differentiates static shapes only."""
    free = [
        vi.name
        for vi in _batched_inputs(model)
        if vi.type.tensor_type.shape.dim and not vi.type.tensor_type.shape.dim[0].HasField("dim_value")
    ]
    return set_batch_dimension(model, free, batch)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Runs ``ort-train inspect``: prints the inputs, outputs and trainable weights of a graph
    and whether ``fit`` can train it.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``inspect`` (:func:`build_parser`).

    Returns
    -------
    int
        :data:`EXIT_OK`.
    """
    model = _load(args.model)
    print(f"model: {args.model} (IR {model.ir_version}; opsets: {_opsets_text(model)})")
    inits = {i.name for i in model.graph.initializer}
    print("inputs:")
    for vi in model.graph.input:
        if vi.name not in inits:
            print(f"  {vi.name}: {_type_text(vi)}")
    print("outputs:")
    for vi in model.graph.output:
        print(f"  {vi.name}: {_type_text(vi)}")
    weights, reason = gradient_status(model, args.output_index, args.backend)
    floats = float_initializers(model)
    output = _output_name(model, args.output_index)
    print(f"trainable float initializers (that output {output!r} depends on): {len(weights)}")
    for name in weights:
        print(f"  {name}: {_tensor_text(floats[name])}")
    statistics = [n for n in running_statistics(model) if n in floats]
    if statistics:
        print(f"running statistics (BatchNormalization state, updated by training): {len(statistics)}")
        for name in statistics:
            print(f"  {name}: {_tensor_text(floats[name])}")
    _print_export_findings(model, output, weights)
    if reason is None:
        print("gradient graph: yes (ort-train fit can train it)")
    else:
        print(f"gradient graph: no: {reason}")
    return EXIT_OK


def _opsets_text(model: ModelProto) -> str:
    """The opsets a model imports, each once in import order: skl2onnx imports ('', 22) twice,
    and '' and 'ai.onnx' name the same domain."""
    opsets = dict.fromkeys((o.domain or "ai.onnx", o.version) for o in model.opset_import)
    return ", ".join(f"{domain} {version}" for domain, version in opsets)


def _tensor_text(t: onnx.TensorProto) -> str:
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).name
    return f"{dtype} {tuple(int(d) for d in t.dims)}"


def _print_export_findings(model: ModelProto, output: str, weights: list[str]) -> None:
    """The exporter constants left out of the trained weights, and the warnings fit gives for
    this graph (merged parameters, BatchNorm possibly folded)."""
    floats = float_initializers(model)
    deps, _ = differentiable_ancestors(model, [output])
    left_out = {n: why for n, why in exporter_constants(model).items() if n in deps}
    if left_out:
        print(f"left out (exporter constants, not parameters): {len(left_out)}")
        for name, why in left_out.items():
            print(f"  {name}: {_tensor_text(floats[name])}: {why}")
    for note in export_notes(model, weights):
        print(f"warning: {note}")


def _check_option_needs(args: argparse.Namespace) -> None:
    """Options that only act with another one are refused without it (else silently ignored)."""
    needs = [
        ("--momentum", args.momentum, args.optimizer == "nesterov", "--optimizer nesterov"),
        ("--tol", args.tol, args.early_stopping, "--early-stopping"),
        ("--patience", args.patience, args.early_stopping, "--early-stopping"),
        ("--checkpoint-every", args.checkpoint_every, args.checkpoint is not None, "--checkpoint DIR"),
    ]
    for option, value, present, needed in needs:
        if value is not None and not present:
            raise _UsageError(f"{option} acts only with {needed}: add it, or leave {option} out")


def _learning_rate(args: argparse.Namespace) -> BaseLearningRate:
    if args.optimizer == "adam":
        return LearningRateAdam(eta0=args.lr if args.lr is not None else 0.001)
    eta = args.lr if args.lr is not None else 0.01
    if args.optimizer in ("nesterov", "momentum"):  # momentum: export-step's only
        momentum = 0.9 if args.momentum is None else args.momentum
        if not 0 <= momentum < 1:
            raise _UsageError(f"--momentum must be in [0, 1), got {momentum}")
        return LearningRateSGDNesterov(
            eta0=eta, learning_rate="constant", momentum=momentum, nesterov=args.optimizer == "nesterov"
        )
    return LearningRateSGD(eta0=eta, learning_rate="constant")


Features = np.ndarray | dict[str, np.ndarray]


def _split(
    X: Features, y: np.ndarray, fraction: float | None, seed: int
) -> tuple[Features, np.ndarray, Features | None, np.ndarray | None]:
    """Holds out a seeded random ``fraction`` of the rows; the rest keep their order."""
    if fraction is None:
        return X, y, None, None
    n = len(y)
    n_val = round(fraction * n)
    if n_val < 1 or n_val >= n:
        raise _UsageError(f"--validation-fraction {fraction} of {n} rows leaves an empty part")
    held = np.zeros(n, dtype=bool)
    held[np.random.default_rng(seed).permutation(n)[:n_val]] = True

    def rows(mask: np.ndarray) -> Features:
        if isinstance(X, dict):  # fit refuses inputs whose row count differs from y's
            return {k: v[mask] if v.ndim and len(v) == n else v for k, v in X.items()}
        return X[mask] if X.ndim and len(X) == n else X

    return rows(~held), y[~held], rows(held), y[held]


def _check_output(path: str, option: str, folder: bool) -> None:
    """Refuses an output path that cannot be written: a folder given as --out, a file given as
    --checkpoint DIR, a path below a file, or a folder where this process cannot create files
    (permissions, a read-only file system). Missing folders are fine: the writer creates them."""
    if not folder and os.path.isdir(path):
        raise _UsageError(f"{option} {path} is a folder; give the file to write, such as {path}/model.onnx")
    if folder and os.path.exists(path) and not os.path.isdir(path):
        raise _UsageError(f"{option} {path} is a file; give a folder")
    existing = os.path.abspath(path) if folder else os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise _UsageError(f"{option} {path}: {existing} is a file, not a folder")
    try:
        check_writable_folder(existing)
    except OSError as exc:
        raise _UsageError(
            f"{option} {path}: cannot create files in {existing} ({exc.strerror}); choose another {option}"
        ) from exc


def _refuse_out_over_inputs(args: argparse.Namespace) -> None:
    """Refuses an --out that is the model, the data or the checkpoint file (by any path: a
    link, a relative spelling, a hard link): the trained graph would replace it."""
    inputs = {"the model": args.model, "--data": args.data}
    if args.checkpoint is not None:
        inputs["the checkpoint"] = os.path.join(args.checkpoint, CHECKPOINT_FILE)
    out = os.path.realpath(args.out)
    for what, path in inputs.items():
        same = os.path.realpath(path) == out
        if not same and os.path.exists(path) and os.path.exists(out):
            same = os.path.samefile(path, out)
        if same:
            raise _UsageError(
                f"--out {args.out} is {what} ({path}): the trained graph would overwrite it; "
                "give another file"
            )


def save_model_atomically(model: ModelProto, path: str) -> None:
    """Writes a model to ``path`` atomically: a crash never leaves half a model there.

    Parameters
    ----------
    model : onnx.ModelProto
        The model to write.
    path : str
        The file; missing folders are created.
    """
    data = model.SerializeToString()
    write_atomically(path, lambda f: f.write(data))


def cmd_fit(args: argparse.Namespace) -> int:
    """Runs ``ort-train fit``: trains a prediction graph on a data file, writes the trained graph.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``fit`` (:func:`build_parser`).

    Returns
    -------
    int
        :data:`EXIT_OK`, or :data:`EXIT_INTERRUPTED` after Ctrl-C (then no model is written).

    Raises
    ------
    ValueError, TypeError, OSError
        Bad options, model or data (:func:`main` exits with :data:`EXIT_BAD_INPUT`).
    ConvergenceError
        The loss diverged (:func:`main` exits with :data:`EXIT_TRAINING_FAILED`).
    """
    if args.resume and args.checkpoint is None:
        raise _UsageError("--resume continues from --checkpoint DIR: give the folder")
    _check_option_needs(args)
    # found now, not after the whole fit (whose weights would be lost without --checkpoint)
    _check_output(args.out, "--out", folder=False)
    if args.checkpoint is not None:
        _check_output(args.checkpoint, "--checkpoint", folder=True)
    _refuse_out_over_inputs(args)
    model = _load(args.model)
    _output_name(model, args.output_index)
    _refuse_unfeedable_inputs(args.model, model)
    X, y, _ = load_table(args.data, args.target, [vi.name for vi in _batched_inputs(model)])
    data = _split(X, y, args.validation_fraction, args.seed)
    loss_model = add_loss_output(model, score_name=args.loss, output_index=args.output_index)
    trainer = _fit_trainer(args, loss_model)
    start = time.perf_counter()
    interrupted = _train(trainer, args, *data)
    elapsed = time.perf_counter() - start
    if interrupted:
        for line in _interrupted_lines(args, trainer):
            print(line, file=sys.stderr)
        return EXIT_INTERRUPTED
    _note_early_stop(args, trainer)
    save_model_atomically(trainer.get_trained_onnx(), args.out)
    losses = trainer.train_losses_
    print(f"epochs: {trainer.n_iter_}")
    print(f"final training loss: {losses[-1]:.6g}" if losses else "final training loss: -")
    if trainer.validation_losses_:
        print(f"final validation loss: {trainer.validation_losses_[-1]:.6g}")
    print(f"time: {elapsed:.2f} s")
    print(f"wrote: {args.out}")
    return EXIT_OK


def _fit_trainer(args: argparse.Namespace, loss_model: ModelProto) -> OrtGradientOptimizer:
    """The trainer the options of ``fit`` describe."""
    from .optimizer import OrtGradientOptimizer

    tol, patience = _stopping_rule(args)
    return OrtGradientOptimizer(
        loss_model,
        max_iter=args.epochs,
        batch_size=args.batch_size,
        learning_rate=_learning_rate(args),
        device=args.device,
        shuffle=args.shuffle,
        random_state=args.seed,
        tol=tol if args.early_stopping else None,
        n_iter_no_change=patience,
        checkpoint_dir=args.checkpoint,
        checkpoint_every=1 if args.checkpoint_every is None else args.checkpoint_every,
        backend=args.backend,
        callbacks=_progress(args),
    )


def _stopping_rule(args: argparse.Namespace) -> tuple[float, int]:
    """--early-stopping's tolerance and patience, defaults filled in."""
    return (1e-4 if args.tol is None else args.tol), (5 if args.patience is None else args.patience)


def _progress(args: argparse.Namespace) -> list[Callback]:
    """The progress callbacks: tqdm's bar (``verbose=1``'s) where its stream, stderr, is a
    terminal; elsewhere (a log, CI, a pipe) one line per epoch, which a bar redrawn with
    carriage returns would turn into one line of kilobytes; nothing with --quiet. Given as
    callbacks, not ``verbose``, so that a note put before them prints before the bar."""
    if args.quiet:
        return []
    if sys.stderr.isatty():
        return [ProgressBar()]
    return [EpochPrinter(stream="stderr", prefix=False)]


class _ResumeNote(Callback):
    """Says where a resumed run starts, before its first epoch line."""

    def __init__(self, path: str, epochs: int) -> None:
        self.path, self.epochs, self.said = path, epochs, False

    def on_train_begin(self, trainer: BaseOrtTrainer, n_epochs: int) -> None:
        if not self.said:
            self.said = True
            end = f"epoch {trainer.n_iter_} (of {self.epochs})"
            print(f"ort-train: note: resumed from {self.path} at the end of {end}", file=sys.stderr)


def _note_early_stop(args: argparse.Namespace, trainer: OrtGradientOptimizer) -> None:
    """One line when --early-stopping ended the fit before --epochs."""
    if not args.early_stopping or trainer.n_iter_ >= args.epochs:
        return
    tol, patience = _stopping_rule(args)
    which = "validation" if trainer.validation_losses_ else "training"
    print(
        f"ort-train: note: stopped early at epoch {trainer.n_iter_}: the {which} loss did not improve "
        f"by tol={tol:g} for {patience} epoch{'s' if patience != 1 else ''}",
        file=sys.stderr,
    )


def _interrupted_lines(args: argparse.Namespace, trainer: OrtGradientOptimizer) -> list[str]:
    """What Ctrl-C leaves and how to continue: the command line with --resume (or why none)."""
    lines = [f"ort-train: interrupted (Ctrl-C) during epoch {trainer.n_iter_ + 1}; no model written"]
    if args.checkpoint is None:
        return [
            *lines,
            "ort-train: without --checkpoint there is nothing to resume: with --checkpoint DIR, "
            "--resume would have continued from the last complete epoch",
        ]
    path = os.path.join(args.checkpoint, CHECKPOINT_FILE)
    argv = getattr(args, "argv", None)  # set by main
    if argv is None:
        command = "the same ort-train fit command with --resume"
    else:
        command = shlex.join(["ort-train", *argv, *([] if args.resume else ["--resume"])])
    return [
        *lines,
        f"ort-train: {path} holds the end of epoch {trainer.n_iter_}; continue with:",
        f"  {command}",
    ]


def _train(
    trainer: OrtGradientOptimizer,
    args: argparse.Namespace,
    X: Features,
    y: np.ndarray,
    X_val: Features | None,
    y_val: np.ndarray | None,
) -> bool:
    """Fits, or resumes with ``--resume``, printing the trainer's warnings to stderr; True when
    Ctrl-C ended the training."""
    existing = os.path.join(args.checkpoint, CHECKPOINT_FILE) if args.checkpoint else None
    if existing and not args.resume and os.path.exists(existing):
        print(
            f"ort-train: note: starting over; {existing} is overwritten (--resume continues it)",
            file=sys.stderr,
        )
    note = (
        _ResumeNote(existing, args.epochs) if args.resume and existing and os.path.exists(existing) else None
    )
    if note is not None:  # first: the note goes before the bar or the first epoch's line
        trainer.callbacks = [note, *(trainer.callbacks or ())]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if args.resume:
            try:
                trainer.resume(X, y, X_val=X_val, y_val=y_val)
            except CheckpointMismatchError as exc:
                raise _resume_refused(exc, str(existing)) from exc
        else:
            trainer.fit(X, y, X_val=X_val, y_val=y_val)
    interrupted = [w for w in caught if issubclass(w.category, TrainingInterruptedWarning)]
    for w in caught:
        if w not in interrupted:  # Ctrl-C: cmd_fit says it in the CLI's words (--resume)
            print(f"ort-train: warning: {_in_option_words(args, w)}", file=sys.stderr)
    if note is not None:  # said once: here when no epoch was left to run
        note.on_train_begin(trainer, 0)
    return bool(interrupted)


def _in_option_words(args: argparse.Namespace, w: warnings.WarningMessage) -> str:
    """A trainer's warning, with the parameter the CLI user set through an option named as
    that option (max_iter is --epochs)."""
    text = str(w.message)
    spent = f"max_iter={args.epochs} reached"
    if issubclass(w.category, ConvergenceWarning) and text.startswith(spent):
        return f"--epochs {args.epochs} reached{text[len(spent) :]}"
    return text


def _resume_refused(exc: CheckpointMismatchError, checkpoint: str) -> _UsageError:
    """The trainer's refusal of a checkpoint, in the words of the options that differ."""
    fix = "or drop --resume to start over"
    if exc.parameter in ("data", "validation_data"):
        return _UsageError(
            f"{checkpoint} was written by a run on other rows than --data, --target and "
            f"--validation-fraction (with --seed) give now; resume with the interrupted run's, {fix}"
        )
    if exc.parameter == "learning_rate":
        return _UsageError(
            f"{checkpoint} continues an optimizer state of --optimizer, --lr and --momentum other "
            f"than this run's ({exc.saved} -> {exc.given}); resume with the interrupted run's, {fix}"
        )
    if exc.parameter == "shuffle":
        saved, given = ("--shuffle" if v else "--no-shuffle" for v in (exc.saved, exc.given))
    else:
        option = {"batch_size": "--batch-size", "random_state": "--seed"}.get(exc.parameter, exc.parameter)
        saved, given = f"{option} {exc.saved}", f"{option} {exc.given}"
    return _UsageError(
        f"{checkpoint} was written with {saved}, this run has {given}; resume with {saved}, {fix}"
    )


def training_objective(
    model: ModelProto, loss: str, output_index: int, feeds: dict[str, np.ndarray], y: np.ndarray
) -> float:
    """The loss ``fit`` trains (reduction mean) on all rows, computed by the same loss graph
    (:func:`~ort_train_core.add_loss_output`), so that eval and fit cannot disagree on a
    loss's formula.

    Parameters
    ----------
    model : onnx.ModelProto
        The prediction graph.
    loss : str
        A loss name of :data:`LOSSES`.
    output_index : int
        The output the loss reads.
    feeds : dict of str to ndarray
        The graph's inputs.
    y : ndarray
        The target, one value (or row) per sample.

    Returns
    -------
    float
        The loss.
    """
    import onnxruntime

    loss_model = add_loss_output(normalise_model(model), score_name=loss, output_index=output_index)
    label_name, loss_name = get_metadata(loss_model, "label_name"), get_metadata(loss_model, "loss_name")
    label = next(i for i in loss_model.graph.input if i.name == label_name)
    tt = label.type.tensor_type
    target = y.astype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
    if len(tt.shape.dim) <= 2:  # a label of rank > 2 (one class per position) has y's shape already
        target = target.reshape(len(y), -1) if len(tt.shape.dim) == 2 else target.reshape(len(y))
    sess = onnxruntime.InferenceSession(loss_model.SerializeToString(), providers=["CPUExecutionProvider"])
    return float(sess.run([loss_name], {**feeds, label_name: target})[0])


def regression_metrics(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Regression metrics over all output columns (scikit-learn's uniform average).

    Parameters
    ----------
    pred : ndarray
        The predictions, one row per sample.
    y : ndarray
        The targets, as many columns as ``pred``.

    Returns
    -------
    dict of str to float
        ``'mse'``, ``'mae'`` and ``'r2'``.

    Raises
    ------
    ValueError
        ``pred`` and ``y`` have different numbers of columns.
    """
    pred = pred.reshape(len(pred), -1).astype(np.float64)
    target = y.reshape(len(y), -1).astype(np.float64)
    if target.shape[1] != pred.shape[1]:
        raise _UsageError(f"the model predicts {pred.shape[1]} column(s), the target has {target.shape[1]}")
    d = pred - target
    ss_tot = ((target - target.mean(0)) ** 2).sum(0)
    ss_res = (d**2).sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.where(ss_tot > 0, 1 - ss_res / ss_tot, np.where(ss_res == 0, 1.0, 0.0))
    return {
        "mse": float((d**2).mean()),
        "mae": float(np.abs(d).mean()),
        "r2": float(r2.mean()),
    }


def classification_metrics(output: np.ndarray, y: np.ndarray, loss: str) -> dict[str, float]:
    """Classification metrics of a model's output.

    Parameters
    ----------
    output : ndarray
        The model's output, one row per sample; ``[N, C, d1, ...]`` scores each position.
    y : ndarray
        The class indices ``0..K-1`` (``[N, d1, ...]``: one per position).
    loss : {'log', 'cross_entropy'}
        ``'log'``: the output holds probabilities; ``'cross_entropy'``: logits (one column:
        binary, sigmoid; several: softmax).

    Returns
    -------
    dict of str to float
        ``'accuracy'`` and ``'log_loss'`` (probabilities clipped at 1e-15, as scikit-learn).

    Raises
    ------
    ValueError
        ``y`` holds something else than class indices the output scores.
    """
    if output.ndim > 2:  # logits [N, C, d1, ...], labels [N, d1, ...]: one row per position
        output, y = np.moveaxis(output, 1, -1).reshape(-1, output.shape[1]), y.reshape(-1)
    out = output.reshape(len(output), -1).astype(np.float64)
    if not np.array_equal(y, np.round(y)) or (y < 0).any():
        raise _UsageError("a classification target holds class indices 0..K-1")
    labels = y.astype(np.int64).ravel()
    if out.shape[1] == 1:
        # tanh form of the sigmoid: 1 / (1 + exp(-z)) overflows (a RuntimeWarning) for z < -709
        p1 = out[:, 0] if loss == "log" else 0.5 * (1.0 + np.tanh(0.5 * out[:, 0]))
        probs = np.column_stack([1 - p1, p1])
    elif loss == "log":
        probs = out
    else:
        z = out - out.max(1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    if labels.max() >= probs.shape[1]:
        raise _UsageError(
            f"the target holds class {labels.max()} but the model scores {probs.shape[1]} classes"
        )
    p_true = probs[np.arange(len(labels)), labels]
    return {
        "accuracy": float((probs.argmax(1) == labels).mean()),
        "log_loss": float(-np.log(np.clip(p_true, 1e-15, None)).mean()),
    }


def _eval_spec(model: ModelProto, loss: str, output_index: int) -> DataSpec:
    """The DataSpec fit would validate the data with: the same graph (add_loss_output) gives
    the same inputs, types, shapes and label layout."""
    loss_model = add_loss_output(normalise_model(model), score_name=loss, output_index=output_index)
    label = get_metadata(loss_model, "label_name")
    inits = {i.name for i in loss_model.graph.initializer}
    inputs = {i.name: i for i in loss_model.graph.input if i.name not in inits}
    features = [name for name in inputs if name != label]
    label_spec = feature_spec(inputs[label])
    return DataSpec(
        features=tuple(feature_spec(inputs[name]) for name in features),
        label_dtype=label_spec.dtype,
        label_tail=tuple(label_spec.dims[1:]) if label_spec.dims else (),
        has_weight=False,
        n_classes=get_metadata(loss_model, "n_classes"),
    )


def cmd_eval(args: argparse.Namespace) -> int:
    """Runs ``ort-train eval``: prints the loss and the metrics of a graph on a data file.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``eval`` (:func:`build_parser`).

    Returns
    -------
    int
        :data:`EXIT_OK`.

    Raises
    ------
    ValueError, OSError
        Bad options, model or data (:func:`main` exits with :data:`EXIT_BAD_INPUT`).
    """
    import onnxruntime

    model = _load(args.model)
    output = _output_name(model, args.output_index)
    _refuse_unfeedable_inputs(args.model, model)
    spec = _eval_spec(model, args.loss, args.output_index)
    X, y, _ = load_table(args.data, args.target, [f.name for f in spec.features])
    # fit's own validation (NaN/inf, complex, dates, shapes, types, class indices), same messages
    *features, y_checked, _ = check_fit_arrays(spec, X, y)
    assert y_checked is not None
    y = y_checked
    feeds = {f.name: a for f, a in zip(spec.features, features) if a is not None}
    try:
        sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        pred = np.asarray(sess.run([output], feeds)[0])
    except _UsageError:
        raise
    except Exception as exc:  # onnxruntime's Fail/InvalidArgument: the data does not fit the model
        raise _UsageError(f"onnxruntime could not run {args.model} on {args.data}: {exc}") from exc
    if args.loss in CLASSIFICATION_LOSSES:
        metrics = classification_metrics(pred, y, args.loss)
    else:
        metrics = regression_metrics(pred, y)
    metrics = {"loss": training_objective(model, args.loss, args.output_index, feeds, y), **metrics}
    print(f"rows: {len(y)}")
    for key, value in metrics.items():
        print(f"{key}: {value:.6g}")
    return EXIT_OK


def _step_paths(out: str) -> dict[str, str]:
    """The files ``export-step`` writes beside ``--out``: the state, the initial-state graph."""
    stem = out[: -len(".onnx")] if out.endswith(".onnx") else out
    return {"npz": stem + ".npz", "init": stem + "_init.onnx"}


def _export_step(args: argparse.Namespace) -> ModelProto:
    """The step the options describe (the loss added as ``fit`` adds it)."""
    from .export import export_training_step

    model = _load(args.model)
    if args.loss is not None:
        _output_name(model, args.output_index)
        model = add_loss_output(
            model,
            score_name=args.loss,
            output_index=args.output_index,
            weight_name="sample_weight" if args.sample_weight else None,
        )
    elif "loss" not in [o.name for o in model.graph.output]:
        raise _UsageError(
            f"{args.model} has no output 'loss': give --loss (one of {', '.join(LOSSES)}) to add one"
        )
    if args.momentum is not None and args.optimizer not in ("momentum", "nesterov"):
        raise _UsageError(
            "--momentum acts only with --optimizer momentum or nesterov: add one, or leave --momentum out"
        )
    return export_training_step(
        model,
        optimizer=_learning_rate(args),
        batch_size=args.batch_size,
        weights_to_train=args.weights,
        sample_weight=args.sample_weight,
    )


def save_step(model: ModelProto, path: str, external: bool) -> list[str]:
    """Writes a step (or any graph) to ``path``; with ``external``, its tensors (initializers
    and Constant values) to ``path + '.data'`` beside it, as onnxruntime loads them.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph; it is not modified.
    path : str
        The ``.onnx`` file.
    external : bool
        Whether to write the tensors as external data.

    Returns
    -------
    list of str
        The files written.
    """
    if not external:
        save_model_atomically(model, path)
        return [path]
    copy = ModelProto()
    copy.CopyFrom(model)
    data = path + ".data"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.exists(data):  # onnx appends to an existing file: the offsets would be wrong
        os.remove(data)
    onnx.save_model(
        copy,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=os.path.basename(data),
        size_threshold=1024,
        convert_attribute=True,
    )
    return [path, data] if os.path.exists(data) else [path]


def cmd_export_step(args: argparse.Namespace) -> int:
    """Runs ``ort-train export-step``: writes the training step, its initial state as ``.npz``
    and, with ``--for-js``, the step without defaults and the initial-state graph.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``export-step`` (:func:`build_parser`).

    Returns
    -------
    int
        :data:`EXIT_OK`.

    Raises
    ------
    ValueError, OSError
        Bad options or model, a graph without gradient (:func:`main` exits with
        :data:`EXIT_BAD_INPUT`).
    """
    from .export import step_initial_state, step_initial_state_model, step_without_defaults

    _check_output(args.out, "--out", folder=False)
    paths = _step_paths(args.out)
    for written in (args.out, paths["npz"], paths["init"]):
        if os.path.exists(args.model) and os.path.realpath(written) == os.path.realpath(args.model):
            raise _UsageError(
                f"export-step would overwrite the model {args.model} with {written}: give another --out"
            )
    step = _export_step(args)
    state = step_initial_state(step)
    external = args.external_data or step.ByteSize() > EXTERNAL_DATA_BYTES
    files = save_step(step_without_defaults(step) if args.for_js else step, args.out, external)
    write_atomically(paths["npz"], lambda f: write_npz(f, state))
    files.append(paths["npz"])
    if args.for_js:
        files += save_step(step_initial_state_model(step), paths["init"], external)
    _print_step_summary(step, files)
    return EXIT_OK


def _print_step_summary(step: ModelProto, files: list[str]) -> None:
    """The step's data inputs, its state in counts, the contract and the files written."""
    from .export import _opset, step_signature

    sig = step_signature(step)
    kinds = {i.name: i for i in step.graph.input}
    for name in sig.data:
        print(f"data input: {name}: {_type_text(kinds[name])}")
    print(
        f"state: {sig.learning_rate}, {len(sig.weights)} weights, {len(sig.optimizer_states)} "
        f"optimizer states, {len(sig.statistics)} statistics" + (f", {sig.step}" if sig.step else "")
    )
    print(f"outputs: {sig.loss}, then <name>_new for each of the {len(sig.state)} state inputs")
    print("contract: feed the data; feed each output <name>_new back as the input <name> of the next step")
    print(f"nodes: {len(step.graph.node)}, opset {_opset(step)}, IR {step.ir_version}")
    for path in files:
        print(f"wrote: {path}")


def _error_text(exc: BaseException) -> str:
    """One line: an OSError without its ``[Errno N]`` prefix, the file named once; the lines of
    a longer message (onnxruntime's) joined."""
    text = str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        name = os.fspath(exc.filename) if exc.filename is not None else ""
        text = exc.strerror if not name or str(name) in exc.strerror else f"{exc.strerror}: {name}"
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _silence_stdout() -> None:
    """Points stdout at os.devnull: the interpreter's last flush into the closed pipe would
    otherwise print 'Exception ignored ... BrokenPipeError' (Python's documented remedy)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a captured stdout): nothing to flush
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one ``ort-train`` command.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments; ``sys.argv[1:]`` by default.

    Returns
    -------
    int
        The exit code (the console script exits with it): :data:`EXIT_OK`,
        :data:`EXIT_TRAINING_FAILED`, :data:`EXIT_BAD_INPUT`, :data:`EXIT_INTERRUPTED` or
        :data:`EXIT_BROKEN_PIPE`.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or bad usage (2): argparse printed the message
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the --resume line after Ctrl-C
    try:
        code: int = args.func(args)
    except BrokenPipeError:  # `ort-train inspect m.onnx | head -1`: the reader has what it wanted
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except ConvergenceError as exc:
        print(f"ort-train: training failed: {_error_text(exc)}", file=sys.stderr)
        return EXIT_TRAINING_FAILED
    except (ValueError, TypeError, OSError, CudaUnavailableError) as exc:  # CUDA: the setup's fix
        print(f"ort-train: error: {_error_text(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RuntimeError as exc:  # onnxruntime failed while training
        print(f"ort-train: training failed: {_error_text(exc)}", file=sys.stderr)
        return EXIT_TRAINING_FAILED
    except MemoryError:  # data that fit on disk and not in memory (a cast, a split, a batch)
        print(
            "ort-train: error: not enough memory for this data; free memory, or train on fewer rows",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # a second Ctrl-C stops at once
        print("ort-train: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code
