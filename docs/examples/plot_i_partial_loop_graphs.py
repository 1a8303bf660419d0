"""
.. _example-partial-loop-graphs:

The graphs of the partial loop
==============================

:class:`ort_train_core.OrtGradientForwardBackwardOptimizer` runs one training step as four
onnxruntime calls over three graphs, all on the same device:

1. the **forward** of the model's gradient graph (onnxruntime-training's ``TrainingAgent``
   stops at the ``YieldOp`` node and hands back the prediction),
2. the **loss graph**: ``(prediction, label, weight) -> (loss, prediction_grad)``, the loss
   nodes of :func:`~ort_train_core.add_loss_output` and their gradient,
3. the **backward** of the gradient graph, from ``prediction_grad`` to the weight gradients,
4. the **penalty and update graph**: ``(weights, gradients, states, learning rate) ->
   (penalty, new weights, new states)``.

These are the real graphs of a trainer after
:meth:`~ort_train_core.OrtGradientForwardBackwardOptimizer.fit`, written by
:meth:`~ort_train_core.OrtGradientForwardBackwardOptimizer.save_onnx_graph` and drawn here with
networkx and matplotlib (no graphviz needed).
"""

import os
import tempfile
import textwrap

import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import onnx
from onnx import helper, numpy_helper

from ort_train_core import (
    ElasticLearningLoss,
    ElasticLearningPenalty,
    LearningRateSGDNesterov,
    OrtGradientForwardBackwardOptimizer,
)

# %%
# A linear model ``Y = X @ coef + intercept`` written with ``onnx.helper``, trained for two
# epochs with Nesterov momentum, an elastic loss and an elastic penalty on ``coef``.

rng = np.random.default_rng(0)
X = rng.standard_normal((64, 3)).astype(np.float32)
y = (X @ np.array([[1.0], [-2.0], [0.5]]) + 0.3).astype(np.float32)
graph = helper.make_graph(
    [
        helper.make_node("MatMul", ["X", "coef"], ["xw"]),
        helper.make_node("Add", ["xw", "intercept"], ["Y"]),
    ],
    "linear",
    [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", 3])],
    [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", 1])],
    [
        numpy_helper.from_array(np.zeros((3, 1), dtype=np.float32), "coef"),
        numpy_helper.from_array(np.zeros(1, dtype=np.float32), "intercept"),
    ],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8

trainer = OrtGradientForwardBackwardOptimizer(
    model,
    max_iter=2,
    batch_size=16,
    learning_rate=LearningRateSGDNesterov(eta0=0.05),
    learning_loss=ElasticLearningLoss(l1_weight=0.1, l2_weight=0.9),
    learning_penalty=ElasticLearningPenalty(l1=0.01, l2=0.01),
)
trainer.fit(X, y)
folder = tempfile.mkdtemp()
paths = trainer.save_onnx_graph(folder)
for name, path in sorted(paths.items()):
    print(f"{name:28s} {os.path.getsize(path):6d} bytes")


# %%
# Drawing an ONNX graph
# ---------------------
#
# One networkx node per operator, per graph input and per graph output; an edge per tensor
# that flows from one to another (initializers and constants left out); operators placed in
# layers by topological order.

COLORS = {
    "input": "#9bd39b",
    "output": "#f3a6a6",
    "op": "#a9c8ee",
    "microsoft": "#f6c77c",
}


def to_networkx(onx):
    g = nx.DiGraph()
    constants = {i.name for i in onx.graph.initializer}
    constants |= {
        o for n in onx.graph.node if n.op_type == "Constant" for o in n.output
    }
    producer = {}
    for i in onx.graph.input:
        if i.name not in constants:
            g.add_node(f"in:{i.name}", label=i.name, kind="input")
            producer[i.name] = f"in:{i.name}"
    for k, node in enumerate(onx.graph.node):
        if node.op_type == "Constant":
            continue
        kind = "microsoft" if node.domain == "com.microsoft" else "op"
        g.add_node(f"op:{k}", label=node.op_type, kind=kind)
        for name in node.input:
            if name in producer:
                g.add_edge(producer[name], f"op:{k}")
        for name in node.output:
            producer[name] = f"op:{k}"
    for o in onx.graph.output:
        g.add_node(f"out:{o.name}", label=o.name, kind="output")
        if o.name in producer:
            g.add_edge(producer[o.name], f"out:{o.name}")
    return g


def layered_layout(g):
    """Layers from top to bottom in topological order; inside a layer, nodes sorted
    by the mean position of their predecessors (fewer crossings), one unit apart."""
    pos = {}

    def parents_x(n):
        xs = [pos[p][0] for p in g.predecessors(n)]
        return sum(xs) / len(xs) if xs else 0.0

    for layer, generation in enumerate(nx.topological_generations(g)):
        nodes = sorted(generation, key=parents_x)
        for k, n in enumerate(nodes):
            pos[n] = (k - (len(nodes) - 1) / 2, -layer)
    return pos


def draw(ax, onx, title):
    g = to_networkx(onx)
    pos = layered_layout(g)
    colors = [COLORS[g.nodes[n]["kind"]] for n in g.nodes]
    nx.draw_networkx_edges(
        g, pos, ax=ax, arrowsize=8, edge_color="#888888", node_size=600
    )
    nx.draw_networkx_nodes(
        g, pos, ax=ax, node_color=colors, node_size=600, node_shape="s"
    )
    labels = {n: g.nodes[n]["label"].replace("_", "_\n", 1) for n in g.nodes}
    nx.draw_networkx_labels(g, pos, labels=labels, ax=ax, font_size=6)
    ax.set_title(f"{title}\n({len(onx.graph.node)} nodes)", fontsize=10)
    ax.axis("off")


# %%
# The three graphs
# ----------------
#
# Green: graph inputs, red: graph outputs, orange: operators of the ``com.microsoft`` domain
# (gradient kernels of onnxruntime-training, the ``YieldOp`` that splits forward and
# backward).

graphs = [
    ("forward_backward_batch16", "forward + backward (TrainingAgent)"),
    ("loss_gradient_batch16", "elastic loss and its gradient"),
    ("penalty_and_update", "penalty gradient + Nesterov update"),
]
fig, axes = plt.subplots(
    1, 3, figsize=(16, 10), gridspec_kw={"width_ratios": [1, 2, 2]}
)
for ax, (name, title) in zip(axes, graphs):
    onx = onnx.load(paths[name])
    for label, values in [
        ("inputs: ", onx.graph.input),
        ("outputs:", onx.graph.output),
    ]:
        names = ", ".join(v.name for v in values)
        print(
            textwrap.fill(
                names, 88, initial_indent=f"{name} {label} ", subsequent_indent="    "
            )
        )
    draw(ax, onx, title)
fig.tight_layout()
