"""Thread cut-off benchmark: the wall time of a full-loop training step (``OrtGradientOptimizer``)
on one intra-op thread against onnxruntime's default (one per physical core), over a grid of
batch sizes and network sizes, for MLPs and small CNNs.

It measures where ``ort_train_core._binding.CPU_ONE_THREAD_MAX_WORK`` (the largest batch x
trained weight values still run on one thread) should sit. Each row also gives the forward
multiply-adds of the MatMul/Gemm/Conv nodes per step (``flops``, 2 per multiply-add), a work
estimate that counts a convolution's spatial positions, which batch x weights does not.

Timing: each setting gets its own trainer (the cut-off forced to 0 or to infinity while it builds
its fused step), one warm-up ``fit``, then ``repeats`` timed fits alternating between the two
settings; us/step is the median. Run:
``python benchmarks/bench_threads.py [--quick] [--out benchmarks/results]``.
"""

from __future__ import annotations

import io
import statistics
import time
from typing import Any

import numpy as np

import _common as common


def _mlp(n_in: int, hidden: int, n_out: int) -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(n_in, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, n_out),
    )


def _cnn(channels: int, side: int, n_out: int) -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, channels, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(channels, channels, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(channels, n_out),
    )


def export(net: Any, shape: tuple[int, ...]) -> Any:
    """The TorchScript export of ``net`` (opset 17, every parameter an initializer)."""
    import onnx
    import torch

    buf = io.BytesIO()
    torch.onnx.export(
        net,
        (torch.zeros((2, *shape)),),
        buf,
        input_names=["X"],
        output_names=["Y"],
        opset_version=17,
        dynamic_axes={"X": {0: "N"}, "Y": {0: "N"}},
        do_constant_folding=False,
        dynamo=False,
    )
    model = onnx.load_from_string(buf.getvalue())
    model.ir_version = min(model.ir_version, 10)
    return model


def forward_flops(model: Any, batch: int) -> float:
    """2 x the multiply-adds of the MatMul, Gemm and Conv nodes of one forward pass at ``batch``."""
    import onnx

    from ort_train_core.graph import set_batch_dimension

    inferred = onnx.shape_inference.infer_shapes(set_batch_dimension(model, ["X"], batch))
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    }
    shapes.update({i.name: list(i.dims) for i in inferred.graph.initializer})
    total = 0.0
    for node in inferred.graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            a, out = shapes[node.input[0]], shapes[node.output[0]]
            k = a[0] if any(x.name == "transA" and x.i for x in node.attribute) else a[-1]
            total += 2.0 * float(np.prod(out)) * k
        elif node.op_type == "Conv":
            w, out = shapes[node.input[1]], shapes[node.output[0]]
            total += 2.0 * float(np.prod(out)) * float(np.prod(w[1:]))
    return total


def time_case(model: Any, x: np.ndarray, y: np.ndarray, batch: int, repeats: int) -> dict[str, Any]:
    """Median us/step of one thread and of the default threads, and the fused step's work."""
    import ort_train_core as otc
    from ort_train_core import _binding, optimizer

    loss_model = otc.add_loss_output(model, score_name="squared_error")
    lr = otc.LearningRateSGD(eta0=1e-3, learning_rate="constant")
    trainers = {}
    saved = _binding.CPU_ONE_THREAD_MAX_WORK
    try:
        for threads, cut in (("1", float("inf")), ("default", -1)):
            _binding.CPU_ONE_THREAD_MAX_WORK = cut  # type: ignore[assignment]
            optimizer._FUSED_GRAPHS.clear()
            trainer = otc.OrtGradientOptimizer(
                loss_model, max_iter=2, batch_size=batch, shuffle=False, learning_rate=lr
            )
            trainer.fit(x, y)
            trainers[threads] = trainer
    finally:
        _binding.CPU_ONE_THREAD_MAX_WORK = saved
        optimizer._FUSED_GRAPHS.clear()
    steps = 2 * (len(x) // batch)
    times: dict[str, list[float]] = {k: [] for k in trainers}
    cpu: dict[str, list[float]] = {k: [] for k in trainers}
    for _ in range(repeats):
        for key, trainer in trainers.items():
            t, c = time.perf_counter(), time.process_time()
            trainer.fit(x, y)
            times[key].append((time.perf_counter() - t) / steps * 1e6)
            cpu[key].append((time.process_time() - c) / steps * 1e6)
    n_weights = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    one, many = statistics.median(times["1"]), statistics.median(times["default"])
    return {
        "batch": batch,
        "weights": n_weights,
        "batch_x_weights": batch * n_weights,
        "flops": forward_flops(model, batch),
        "us_1": one,
        "us_default": many,
        "ratio": many / one,
        "cpu_us_1": statistics.median(cpu["1"]),
        "cpu_us_default": statistics.median(cpu["default"]),
        "spread_1": (max(times["1"]) - min(times["1"])) / one,
        "spread_default": (max(times["default"]) - min(times["default"])) / many,
    }


def cases(quick: bool) -> list[tuple[str, Any, tuple[int, ...], list[int]]]:
    """(name, torch network, input shape, batch sizes) of the grid."""
    batches = [16, 128, 1024] if quick else [16, 64, 256, 1024]
    mlps = [
        (f"mlp 64-{h}-{h}-10", _mlp(64, h, 10), (64,), batches)
        for h in ((16, 128) if quick else (16, 64, 128, 256))
    ]
    cnns = [
        (f"cnn c{c} {s}x{s}", _cnn(c, s, 10), (3, s, s), [8, 32] if quick else [8, 32, 128])
        for c, s in (((8, 8), (16, 16)) if quick else ((8, 8), (16, 8), (8, 16), (16, 16), (32, 16)))
    ]
    return mlps + cnns


def main(argv: list[str] | None = None) -> int:
    parser = common.arguments(__doc__, "a smaller grid, fewer repeats")
    args = parser.parse_args(argv)
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    repeats = 3 if args.quick else 5
    rows = []
    for name, net, shape, batch_sizes in cases(args.quick):
        model = export(net, shape)
        for batch in batch_sizes:
            n = batch * max(2, 4096 // batch if name.startswith("mlp") else 512 // batch)
            x = rng.standard_normal((n, *shape)).astype(np.float32)
            y = rng.standard_normal((n, 10)).astype(np.float32)
            row = {"case": name, **time_case(model, x, y, batch, repeats), "load": common.loadavg()}
            print(row, flush=True)
            rows.append(row)
    header = [
        "case",
        "batch",
        "batch x weights",
        "forward flops",
        "us/step 1 thread",
        "us/step default",
        "default / 1",
        "cpu us 1",
        "cpu us default",
        "spread 1/default",
        "load",
    ]
    lines = common.markdown_table(
        header,
        [
            [
                r["case"],
                str(r["batch"]),
                f"{r['batch_x_weights']:.3g}",
                f"{r['flops']:.3g}",
                f"{r['us_1']:.0f}",
                f"{r['us_default']:.0f}",
                f"{r['ratio']:.2f}",
                f"{r['cpu_us_1']:.0f}",
                f"{r['cpu_us_default']:.0f}",
                f"{r['spread_1']:.0%}/{r['spread_default']:.0%}",
                f"{r['load']}",
            ]
            for r in rows
        ],
    )
    info = common.machine_info()
    text = (
        "# Thread cut-off: one thread against the default\n\n"
        + common.machine_line(info)
        + "\n\n"
        + "\n".join(lines)
        + "\n"
    )
    common.write_report(args.out, "threads", args.quick, {"machine": info, "rows": rows}, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
