"""Partial training: the graph's forward and backward run through TrainingAgent; the loss, the
penalty and the update are small ONNX graphs of their own, run on the same device. The fit loop
is the one the full loop uses; only the step differs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper

from ._binding import DeviceArray, make_session
from ._data import BatchStore
from ._gradient import (
    ForwardBackwardGraphs,
    UpdateSignature,
    build_forward_backward,
    build_loss_gradient_graph,
    build_update_graph,
    cpu_gradient_rewrites,
)
from ._loss_trainer import LossGraphTrainer
from ._runner import DoubleBufferedRunner, host_ortvalue
from ._runtime import C, Device
from .callbacks import Callback
from .checkpoint import TrainingState
from .graph import (
    add_loss_output,
    all_names,
    default_weights_to_train,
    normalise_model,
    output_shape,
    set_batch_dimension,
)
from .learning_rate import BaseLearningRate
from .losses import (
    BaseLearningLoss,
    BaseLearningPenalty,
    CrossEntropyLearningLoss,
    NegLogLearningLoss,
    NoLearningPenalty,
    make_loss,
)


class OrtGradientForwardBackwardOptimizer(LossGraphTrainer):
    """Trains a prediction graph with a pluggable loss, penalty and learning rate.

    ``learning_penalty`` applies to every trained weight of rank >= 2 (not biases).
    ``weight_name`` names the sample-weight input of the loss graphs it builds.
    ``checkpoint_dir``/``checkpoint_every``: see :meth:`fit` and :meth:`resume`.
    """

    def __init__(
        self,
        model_onnx: ModelProto,
        weights_to_train: Sequence[str] | None = None,
        max_iter: int = 100,
        batch_size: int = 10,
        learning_rate: Any = "SGD",
        device: str = "cpu",
        warm_start: bool = False,
        verbose: int = 0,
        learning_loss: str | BaseLearningLoss = "square_error",
        learning_penalty: BaseLearningPenalty | None = None,
        weight_name: str | None = None,
        shuffle: bool = True,
        random_state: int | None = None,
        output_index: int = 0,
        reduction: str = "mean",
        tol: float | None = None,
        n_iter_no_change: int = 5,
        callbacks: Sequence[Callback] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 1,
    ) -> None:
        self.model_onnx = model_onnx
        self.weights_to_train = weights_to_train
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.device = device
        self.warm_start = warm_start
        self.verbose = verbose
        self.learning_loss = learning_loss
        self.learning_penalty = learning_penalty
        self.weight_name = weight_name
        self.shuffle = shuffle
        self.random_state = random_state
        self.output_index = output_index
        self.reduction = reduction
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.callbacks = callbacks
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every

    # ---- the pieces ------------------------------------------------------------------------
    def _loss(self) -> BaseLearningLoss:
        loss = make_loss(self.learning_loss)
        loss.validate()
        return loss

    def _penalty(self) -> BaseLearningPenalty:
        penalty = NoLearningPenalty() if self.learning_penalty is None else self.learning_penalty
        if not isinstance(penalty, BaseLearningPenalty):
            raise TypeError(
                "learning_penalty must be None, NoLearningPenalty() or ElasticLearningPenalty(l1, l2), "
                f"not {penalty!r}"
            )
        penalty.validate()
        return penalty

    def _model_key(self) -> tuple[Any, ...]:
        return (
            id(self.model_onnx),
            self.reduction,
            repr(self.learning_loss),
            repr(self.learning_penalty),
            self.weight_name,
            self.output_index,
            None if self.weights_to_train is None else tuple(self.weights_to_train),
        )

    def _build_loss_model(self) -> ModelProto:
        """The evaluation graph: prediction, learning loss and penalty (the objective)."""
        model = normalise_model(self.model_onnx)
        outputs = model.graph.output
        if not 0 <= self.output_index < len(outputs):
            raise ValueError(f"output_index={self.output_index} but the graph has {len(outputs)} output(s)")
        weights = (
            list(self.weights_to_train)
            if self.weights_to_train is not None
            else default_weights_to_train(model, outputs[self.output_index].name)
        )
        penalty = self._penalty()
        ranks = {i.name: len(i.dims) for i in model.graph.initializer}
        penalized = {w: penalty for w in weights if ranks.get(w, 0) >= 2}
        taken = all_names(model)
        return add_loss_output(
            model,
            self._loss(),
            loss_name=_free(taken, "loss"),
            label_name=_free(taken, "label"),
            weight_name=_free(taken, self.weight_name or "sample_weight"),
            penalty=penalized,
            output_index=self.output_index,
            reduction=self.reduction,
        )

    @property
    def _loss_name(self) -> str:
        return _free(all_names(normalise_model(self.model_onnx)), "loss")

    def _penalized(self) -> list[str]:
        weights, *_ = self._names()
        shapes = {i.name: len(i.dims) for i in self._model().graph.initializer}
        return (
            [w for w in weights if shapes[w] >= 2]
            if not isinstance(self._penalty(), NoLearningPenalty)
            else []
        )

    def _forward_backward(self, device: Device, batch: int) -> tuple[ForwardBackwardGraphs, Any, Any]:
        """The TrainingAgent for one batch size: with the batch dimension fixed, onnxruntime
        drops the run-time shape arithmetic of the backward, as in the full loop."""
        weights, _, _, features = self._names()
        key = ("forward_backward", tuple(weights), str(device), batch)
        if key not in self._graph_cache:
            model = set_batch_dimension(self._prediction_model(), features, batch)
            graphs = build_forward_backward(model, weights, [])
            if device.kind == "cpu":
                inits = {i.name: i.data_type for i in self._model().graph.initializer}
                graphs.gradient_model = cpu_gradient_rewrites(graphs.gradient_model, inits[weights[0]])
            sess = make_session(graphs.gradient_model, device)
            dev = device.ort_device
            agent = C.TrainingAgent(
                sess,
                [*graphs.input_names, *weights],
                [dev] * len(graphs.output_names),
                graphs.fetch_names,
                [dev] * len(graphs.fetch_names),
                0,
            )
            self._graph_cache[key] = (graphs, sess, agent)
        value: tuple[ForwardBackwardGraphs, Any, Any] = self._graph_cache[key]
        return value

    def _loss_gradient(self, batch: int, device: Device) -> tuple[ModelProto, Any]:
        key = ("loss_gradient", batch, str(device))
        if key not in self._graph_cache:
            pred_model = self._prediction_model()
            pred = pred_model.graph.output[self.output_index].name
            pred_type, pred_shape = output_shape(pred_model, pred)
            model = build_loss_gradient_graph(self._loss(), pred_type, pred_shape, batch, self.reduction)
            self._graph_cache[key] = (model, make_session(model, device))
        value: tuple[ModelProto, Any] = self._graph_cache[key]
        return value

    def _update(self, device: Device, lr: BaseLearningRate) -> tuple[ModelProto, UpdateSignature, Any]:
        key = ("update", str(device), repr(lr))
        if key not in self._graph_cache:
            weights, *_ = self._names()
            inits = {i.name: i for i in self._model().graph.initializer}
            spec = [(w, inits[w].data_type, list(inits[w].dims)) for w in weights]
            model, sig = build_update_graph(spec, lr, self._penalty(), self._penalized())
            self._graph_cache[key] = (model, sig, make_session(model, device))
        value: tuple[ModelProto, UpdateSignature, Any] = self._graph_cache[key]
        return value

    def get_trained_onnx(self, with_probability: bool = False) -> ModelProto:
        """The prediction graph with the trained weights; ``with_probability=True`` appends the
        probability function the loss applied to the raw scores (sigmoid or softmax), so the
        exported output holds probabilities."""
        model = super().get_trained_onnx()
        if not with_probability:
            return model
        loss = self._loss()
        pred = model.graph.output[self.output_index]
        _, shape = output_shape(model, pred.name)
        n_cols = shape[1] if len(shape) == 2 else 1
        if isinstance(loss, NegLogLearningLoss):
            function = loss.probability_function
        elif isinstance(loss, CrossEntropyLearningLoss):
            function = "sigmoid" if n_cols == 1 else "softmax"
        else:
            function = "none"
        if function == "none":
            raise ValueError(
                f"{type(loss).__name__} applies no probability function; export without with_probability"
            )
        raw = _free(all_names(model), f"{pred.name}_raw")
        for node in model.graph.node:
            node.output[:] = [raw if o == pred.name else o for o in node.output]
            node.input[:] = [raw if i == pred.name else i for i in node.input]
        attrs: dict[str, Any] = {"axis": 1} if function == "softmax" else {}
        op = "Sigmoid" if function == "sigmoid" else "Softmax"
        model.graph.node.append(helper.make_node(op, [raw], [pred.name], name=f"{op}_probability", **attrs))
        onnx.checker.check_model(model)
        return model

    def _graphs_to_save(self) -> dict[str, ModelProto]:
        out = {"evaluation_loss": self._model()}
        for key, value in self._graph_cache.items():
            if not isinstance(key, tuple):
                continue
            if key[0] == "forward_backward":
                out[f"forward_backward_batch{key[-1]}"] = value[0].gradient_model
            elif key[0] == "loss_gradient":
                out[f"loss_gradient_batch{key[1]}"] = value[0]
            elif key[0] == "update":
                out["penalty_and_update"] = value[0]
        return out

    def _make_runner(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        validation: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None,
    ) -> _PartialRunner:
        sizes = sorted({e - s for s, e in store.bounds})
        _, label, weight, features = self._names()
        return _PartialRunner(
            store,
            state,
            device,
            lr,
            {size: self._forward_backward(device, size) for size in sizes},
            {size: self._loss_gradient(size, device)[1] for size in sizes},
            self._update(device, lr),
            self.output_index,
            self._evaluator(device) if validation is not None else None,
            validation,
            self._loss_name,
            [*features, label] + ([weight] if weight else []),
        )


def _free(taken: set[str], base: str) -> str:
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


class _PartialRunner(DoubleBufferedRunner):
    """forward (TrainingAgent) -> loss graph -> backward -> penalty and update graph."""

    def __init__(
        self,
        store: BatchStore,
        state: TrainingState,
        device: Device,
        lr: BaseLearningRate,
        forward_backward: dict[int, tuple[ForwardBackwardGraphs, Any, Any]],
        loss_sessions: dict[int, Any],
        update: tuple[ModelProto, UpdateSignature, Any],
        output_index: int,
        evaluator: Any,
        validation: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None,
        loss_name: str,
        data_names: list[str],
    ) -> None:
        graphs = next(iter(forward_backward.values()))[0]
        self.agents = {size: agent for size, (_, _, agent) in forward_backward.items()}
        super().__init__(
            store, state, device, lr, graphs.weights, evaluator, validation, loss_name, data_names
        )
        self.n_inputs = len(graphs.input_names)
        self.n_outputs = len(graphs.output_names)
        self.output_index = output_index
        self.loss_sessions = loss_sessions
        self.loss_host = np.zeros((), dtype=self.dtype)
        self.loss_value = host_ortvalue(self.loss_host)
        self.penalty_host = np.zeros((), dtype=self.dtype)
        self.penalty_value = host_ortvalue(self.penalty_host)
        self.batch_penalties = [DeviceArray.zeros((), self.dtype, device) for _ in self.batch_losses]
        _, self.update_sig, update_sess = update
        self.update_bindings = []
        for parity in (0, 1):
            b = C.SessionIOBinding(update_sess)
            self.bind_update(b, self.update_sig, parity)
            if self.update_sig.penalty is not None:
                b.bind_ortvalue_output(self.update_sig.penalty, self.penalty_value)
            self.update_bindings.append((update_sess.run_with_iobinding, b))
        n = len(store.bounds)
        self.sizes = [e - s for s, e in store.bounds]
        self.forward_inputs: list[list[Any]] = [[None] * n, [None] * n]
        self.loss_entries: list[Any] = [None] * n
        # Forward outputs, their gradients and the weight gradients land in fixed buffers that
        # onnxruntime writes in place: each is bound once, not at every step.
        self.outputs: dict[int, list[DeviceArray]] = {}
        self.output_vectors: dict[int, Any] = {}
        self.output_grads: dict[int, Any] = {}
        self.output_grad_buffers: dict[int, list[DeviceArray]] = {}
        for size in sorted(set(self.sizes)):
            self._allocate_outputs(size)
        self.weight_grads = [
            DeviceArray.zeros(self.buffers[w][0].shape, self.dtype, device) for w in self.weight_names
        ]
        self.weight_grad_vector = _vector(g.ortvalue for g in self.weight_grads)
        for _, binding in self.update_bindings:
            for name, g in zip(self.update_sig.grads, self.weight_grads):
                binding.bind_ortvalue_input(name, g.ortvalue)

    def _allocate_outputs(self, size: int) -> None:
        """Output shapes come from one forward of the first batch of that size (its state is
        dropped without a backward)."""
        batch = self.sizes.index(size)
        probe = C.OrtValueVector()
        agent = self.agents[size]
        agent.run_forward(self._forward_inputs(batch), probe, C.PartialGraphExecutionState(), None)
        shapes = [tuple(probe[k].shape()) for k in range(len(probe))]
        dtypes = [np.asarray(probe[k].numpy()).dtype for k in range(len(probe))]
        self.outputs[size] = [DeviceArray.zeros(sh, dt, self.device) for sh, dt in zip(shapes, dtypes)]
        self.output_vectors[size] = _vector(a.ortvalue for a in self.outputs[size])
        self.output_grad_buffers[size] = [
            DeviceArray.zeros(shape, self.dtype, self.device) for shape in shapes
        ]
        self.output_grads[size] = _vector(a.ortvalue for a in self.output_grad_buffers[size])

    def _forward_inputs(self, batch: int) -> Any:
        data = self.store.batches[batch]
        vec = _vector(
            [*data[: self.n_inputs], *(self.buffers[w][self.parity].ortvalue for w in self.weight_names)]
        )
        self.forward_inputs[self.parity][batch] = vec
        return vec

    def _loss_entry(self, batch: int) -> tuple[Any, Any]:
        """The loss graph's binding for this batch: prediction, label and weight in, the loss and
        the prediction's gradient (the backward's output gradient) out, all bound once."""
        size = self.sizes[batch]
        sess = self.loss_sessions[size]
        b = C.SessionIOBinding(sess)
        data = self.store.batches[batch]
        b.bind_ortvalue_input("prediction", self.outputs[size][self.output_index].ortvalue)
        b.bind_ortvalue_input("label", data[self.n_inputs])
        b.bind_ortvalue_input("weight", data[self.n_inputs + 1])
        b.bind_ortvalue_output("loss", self.loss_output(batch, self.loss_value))
        b.bind_ortvalue_output("prediction_grad", self.output_grad_buffers[size][self.output_index].ortvalue)
        entry = (sess.run_with_iobinding, b)
        self.loss_entries[batch] = entry
        return entry

    def step(self, batch: int) -> float:
        size = self.sizes[batch]
        state = C.PartialGraphExecutionState()
        agent = self.agents[size]
        vin = self.forward_inputs[self.parity][batch] or self._forward_inputs(batch)
        agent.run_forward(vin, self.output_vectors[size], state, None)
        run_loss, loss_binding = self.loss_entries[batch] or self._loss_entry(batch)
        run_loss(loss_binding, None)
        agent.run_backward(self.output_grads[size], self.weight_grad_vector, state)
        run_update, update_binding = self.update_bindings[self.parity]
        if self.per_step_scalars:
            self._write_scalars()
        if self.device_resident and self.update_sig.penalty is not None:
            update_binding.bind_ortvalue_output(self.update_sig.penalty, self.batch_penalties[batch].ortvalue)
        run_update(update_binding, None)
        self.parity ^= 1
        self.n_steps += 1
        if self.device_resident:
            return 0.0
        return float(self.loss_host) + float(self.penalty_host)

    def epoch_losses(self, n_done: int, first: int = 0) -> np.ndarray:
        losses = super().epoch_losses(n_done, first)
        if self.update_sig.penalty is not None:
            losses += [float(a.read()) for a in self.batch_penalties[first:n_done]]
        return losses


def _vector(values: Any) -> Any:
    vec = C.OrtValueVector()
    for ov in values:
        vec.push_back(ov)
    return vec
