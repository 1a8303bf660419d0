"""OnnxModule's ``threads`` (issue 26 item 23): onnxruntime's intra-op threads of every session
the module makes (the forward/backward pairs, the inference session); None keeps onnxruntime's
default pool. The gradients stay torch's."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
import torch
from torch_models import onnx_from_torch_mlp, torch_mlp

from ort_train_torch import OnnxModule


def _threads_of(session: Any) -> int:
    return int(session.session_options.intra_op_num_threads)


def _sessions(module: OnnxModule) -> list[Any]:
    sessions = []
    for fb in module._graphs.values():
        # the onnx backend's pair: a forward and a backward session per input shapes seen
        sessions.extend(getattr(fb._pair, "sessions", [fb._pair.session]))
        if fb._inference is not None:
            sessions.append(fb._inference)
    return sessions


def test_every_session_of_the_module_takes_threads() -> None:
    net = torch_mlp([3, 5, 2], seed=1)
    module = OnnxModule(onnx_from_torch_mlp(net), threads=2)
    assert module.threads == 2
    x = torch.randn(4, 3, requires_grad=True)
    module(x).sum().backward()  # a pair with an input gradient
    x_net = x.detach().clone().requires_grad_(True)
    net(x_net).sum().backward()
    torch.testing.assert_close(x.grad, x_net.grad, rtol=1e-5, atol=1e-6)
    module.eval()
    with torch.no_grad():
        torch.testing.assert_close(module(x.detach()), net(x.detach()), rtol=1e-5, atol=1e-6)
    sessions = _sessions(module)
    assert len(sessions) >= 3  # two pairs, one inference session
    assert {_threads_of(s) for s in sessions} == {2}
    for again in (pickle.loads(pickle.dumps(module)), copy.deepcopy(module)):
        assert again.threads == 2
        again(x.detach())
        assert {_threads_of(s) for s in _sessions(again)} == {2}


def test_default_keeps_onnxruntimes_pool_and_bad_values_are_refused() -> None:
    model = onnx_from_torch_mlp(torch_mlp([3, 2], seed=0))
    module = OnnxModule(model)
    module(torch.randn(4, 3, requires_grad=True))  # the sessions a training forward makes
    assert {_threads_of(s) for s in _sessions(module)} == {0}
    with pytest.raises(ValueError, match=r"threads must be None .* got 0"):
        OnnxModule(model, threads=0)
