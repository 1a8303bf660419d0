"""DistributedDataParallel over a model holding an ``OnnxModule``: two processes, loopback
only; gloo on CPU, nccl with one GPU per rank (marked ``cuda``). Each rank trains on its half
of a fixed batch; DDP averages the gradients, so both ranks must end with the parameters a
single process reaches on the full batch."""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch_models import onnx_from_torch_mlp, torch_mlp, torch_weights_as_onnx

from ort_train_torch import OnnxModule

WORLD_SIZE = 2
STEPS = 3
LR = 0.1
BATCH = 16  # even: both halves the same size, so the mean of the two half-batch means is the full mean
SIZES = (6, 8, 1)
IN_FEATURES = 4
#: a hang (rendezvous, collective) fails the test instead of blocking the run
PG_TIMEOUT_S = 30
JOIN_TIMEOUT_S = 90
N_GPUS = torch.cuda.device_count()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    x = torch.randn(BATCH, IN_FEATURES, generator=g)
    y = torch.randn(BATCH, 1, generator=g)
    return x, y


def _initial_networks() -> tuple[nn.Linear, nn.Sequential]:
    """A torch layer in front of the MLP (its output is the ONNX graph's input, so the input
    gradient path is exercised too) and the pure-torch MLP, both seeded."""
    with torch.random.fork_rng():
        torch.manual_seed(7)
        front = nn.Linear(IN_FEATURES, SIZES[0])
        mlp = torch_mlp(SIZES, seed=0)
    return front, mlp


def _worker(
    rank: int,
    port: int,
    onnx_bytes: bytes,
    front_state: dict[str, torch.Tensor],
    out_dir: str,
    backend: str = "gloo",
) -> None:
    """One DDP rank; top level so that spawn can import it. Exceptions reach the parent through
    ``torch.multiprocessing.spawn`` (with the child's traceback)."""
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if sys.platform.startswith("linux") and "lo" in {name for _, name in socket.if_nameindex()}:
        # gloo's transport on the loopback interface, not on whatever the hostname resolves to
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        backend, rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=PG_TIMEOUT_S)
    )
    try:
        device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
        front = nn.Linear(IN_FEATURES, SIZES[0])
        front.load_state_dict(front_state)
        model = nn.Sequential(front, nn.Tanh(), OnnxModule(onnx_bytes)).to(device)
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)
        x, y = _data()
        x, y = x[rank::WORLD_SIZE].to(device), y[rank::WORLD_SIZE].to(device)
        for _ in range(STEPS):
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
        state = {k: v.detach().cpu().numpy().copy() for k, v in ddp.module.state_dict().items()}
        np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **state)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run_ranks(args: tuple[Any, ...]) -> None:
    """Spawns the ranks and joins them under a deadline; kills them on timeout."""
    context = mp.spawn(_worker, args=args, nprocs=WORLD_SIZE, join=False)
    assert context is not None
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        while not context.join(timeout=1.0):  # raises with the child's traceback if a rank failed
            if time.monotonic() > deadline:
                pytest.fail(f"DDP ranks still running after {JOIN_TIMEOUT_S} s")
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
                p.join(5)


def _reference(front: nn.Linear, mlp: nn.Sequential) -> dict[str, np.ndarray]:
    """Single process, full batch, same optimiser and steps; named as the DDP model's state_dict."""
    net = nn.Sequential(front, nn.Tanh(), mlp)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    x, y = _data()
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    out = {"0.weight": front.weight.detach().numpy().copy(), "0.bias": front.bias.detach().numpy().copy()}
    out.update({f"2.{k}": v.numpy().copy() for k, v in torch_weights_as_onnx(mlp).items()})
    return out


@pytest.mark.parametrize(
    "backend",
    [
        "gloo",
        pytest.param(
            "nccl",
            marks=[
                pytest.mark.cuda,
                pytest.mark.skipif(
                    N_GPUS < WORLD_SIZE,
                    reason=f"nccl needs a GPU per rank ({WORLD_SIZE}); torch sees {N_GPUS}",
                ),
            ],
        ),
    ],
)
def test_ddp_two_ranks_match_single_process_full_batch(tmp_path: Path, backend: str) -> None:
    front, mlp = _initial_networks()
    onnx_bytes = onnx_from_torch_mlp(mlp).SerializeToString()
    front_state = {k: v.clone() for k, v in front.state_dict().items()}
    initial = {f"2.{k}": v.numpy().copy() for k, v in torch_weights_as_onnx(mlp).items()}

    _run_ranks((_free_port(), onnx_bytes, front_state, str(tmp_path), backend))

    ranks = []
    for r in range(WORLD_SIZE):
        with np.load(tmp_path / f"rank{r}.npz") as f:
            ranks.append({k: f[k] for k in f.files})
    expected = _reference(front, mlp)

    assert set(ranks[0]) == set(ranks[1]) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=f"ranks differ on {name}")
        np.testing.assert_allclose(ranks[0][name], value, rtol=0, atol=1e-5, err_msg=f"{name} vs full batch")
    for name, value in initial.items():  # the steps did move the ONNX parameters
        assert not np.allclose(ranks[0][name], value, rtol=0, atol=1e-4), name
