"""
.. _example-numpy-onnxruntime:

numpy against onnxruntime on simple functions
=============================================

Every step of a training loop is a handful of small computations. How fast onnxruntime runs
one graph, compared with numpy running the same function, depends on the size of the data:
each ``InferenceSession.run`` has a fixed cost that numpy does not pay (about 10 microseconds
on a 2-core x86-64 virtual machine; the smallest sizes below show it on the machine that built
this page), while onnxruntime fuses, vectorises and multi-threads larger work. Two functions,
growing sizes:

* an element-wise function, ``y = exp(-x^2) * 0.5 + x``;
* a matrix product of two square matrices.
"""

import timeit

import matplotlib.pyplot as plt
import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper


def model(nodes, inputs, output_shape, initializers=()):
    """An InferenceSession over a one-output float graph.

    ``inputs`` maps names to shapes."""
    graph = helper.make_graph(
        nodes,
        "f",
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
            for name, shape in inputs.items()
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, output_shape)],
        list(initializers),
    )
    onx = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onx.ir_version = 8  # onnxruntime 1.19 reads IR versions up to 10
    onnx.checker.check_model(onx)
    return onnxruntime.InferenceSession(
        onx.SerializeToString(), providers=["CPUExecutionProvider"]
    )


half = onnx.numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half")
elementwise = model(
    [
        helper.make_node("Mul", ["X", "X"], ["x2"]),
        helper.make_node("Neg", ["x2"], ["nx2"]),
        helper.make_node("Exp", ["nx2"], ["e"]),
        helper.make_node("Mul", ["e", "half"], ["eh"]),
        helper.make_node("Add", ["eh", "X"], ["Y"]),
    ],
    {"X": ["N"]},
    ["N"],
    [half],
)
matmul = model(
    [helper.make_node("MatMul", ["A", "B"], ["Y"])],
    {"A": ["N", "K"], "B": ["K", "M"]},
    ["N", "M"],
)


def numpy_elementwise(x):
    return np.exp(-(x * x)) * np.float32(0.5) + x


def timing(fn, number):
    return min(timeit.repeat(fn, number=number, repeat=3)) / number


rng = np.random.default_rng(0)
sizes = [10, 100, 1_000, 10_000, 100_000, 1_000_000]
elem = []
for n in sizes:
    x = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(
        elementwise.run(None, {"X": x})[0], numpy_elementwise(x), rtol=1e-5, atol=1e-6
    )
    number = max(1, 20_000 // int(np.sqrt(n)))
    t_numpy = timing(lambda x=x: numpy_elementwise(x), number)
    t_ort = timing(lambda x=x: elementwise.run(None, {"X": x}), number)
    elem.append((t_numpy, t_ort))
    us_numpy, us_ort = (t * 1e6 for t in elem[-1])
    print(
        f"elementwise n={n:8d}: numpy {us_numpy:9.1f} us, onnxruntime {us_ort:9.1f} us"
    )

dims = [4, 16, 64, 256, 512]
mm = []
for d in dims:
    a = rng.standard_normal((d, d)).astype(np.float32)
    b = rng.standard_normal((d, d)).astype(np.float32)
    number = max(1, 200_000 // d**2)
    t_numpy = timing(lambda a=a, b=b: a @ b, number)
    t_ort = timing(lambda a=a, b=b: matmul.run(None, {"A": a, "B": b}), number)
    mm.append((t_numpy, t_ort))
    us_numpy, us_ort = (t * 1e6 for t in mm[-1])
    print(
        f"matmul {d:4d}x{d:<4d}: numpy {us_numpy:9.1f} us, onnxruntime {us_ort:9.1f} us"
    )

# %%
# For small arrays the fixed cost of a session run dominates and numpy is faster; on large
# element-wise work onnxruntime's kernels catch up; for matrix products both call optimised
# kernels (the exact crossing points depend on the machine). That is why the trainers bind
# their buffers once and run one graph per step (the full loop) rather than many small ones,
# and why the partial loop, with four runs per step, costs more per step than the fused one.

elem, mm = np.array(elem), np.array(mm)
fig, ax = plt.subplots(1, 2, figsize=(11, 4))
ax[0].plot(sizes, elem[:, 0] * 1e6, "o-", label="numpy")
ax[0].plot(sizes, elem[:, 1] * 1e6, "o-", label="onnxruntime")
ax[0].set_title("exp(-x^2) * 0.5 + x")
ax[0].set_xlabel("number of values")
ax[1].plot(dims, mm[:, 0] * 1e6, "o-", label="numpy")
ax[1].plot(dims, mm[:, 1] * 1e6, "o-", label="onnxruntime")
ax[1].set_title("matrix product")
ax[1].set_xlabel("matrix dimension")
for a in ax:
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_ylabel("us per call")
    a.legend()
fig.tight_layout()
