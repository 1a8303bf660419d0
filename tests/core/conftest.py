"""Fixtures of the core tests: the models of :mod:`core_models` as factory fixtures
(``make_linear``, ``make_mlp``) so that a test can ask for a variant (names, sizes, opset,
final activation), their loss graphs and small data sets."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
import pytest
from core_models import (
    build_linear,
    build_mlp,
    initializers,
    linear_forward,
    linear_sgd_reference,
    mlp_forward,
)

import ort_train_core


@pytest.fixture
def make_linear() -> Callable[..., onnx.ModelProto]:
    return build_linear


@pytest.fixture
def make_mlp() -> Callable[..., onnx.ModelProto]:
    return build_mlp


@pytest.fixture
def ref() -> Any:
    """Numpy references: forward passes, initial weights, and linear SGD."""

    class _Ref:
        initializers = staticmethod(initializers)
        linear_forward = staticmethod(linear_forward)
        mlp_forward = staticmethod(mlp_forward)
        linear_sgd = staticmethod(linear_sgd_reference)

    return _Ref


@pytest.fixture
def linear_loss_model() -> onnx.ModelProto:
    """The 3-feature linear model with a squared-error loss output."""
    return ort_train_core.add_loss_output(build_linear())


@pytest.fixture
def weighted_linear_loss_model() -> onnx.ModelProto:
    """The same with a sample-weight input named 'weight'."""
    return ort_train_core.add_loss_output(build_linear(), weight_name="weight")


@pytest.fixture
def mlp_loss_model() -> onnx.ModelProto:
    return ort_train_core.add_loss_output(build_mlp())


@pytest.fixture
def linear_data() -> tuple[np.ndarray, np.ndarray]:
    """23 rows (not a multiple of the usual batch size 10) of a noise-free linear target."""
    rng = np.random.default_rng(42)
    X = rng.standard_normal((23, 3)).astype(np.float32)
    y = (X @ np.array([1.5, -2.0, 0.5]) + 0.25).astype(np.float32)
    return X, y


@pytest.fixture
def mlp_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    X = rng.standard_normal((50, 4)).astype(np.float32)
    y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]).astype(np.float32)
    return X, y


@pytest.fixture
def sigint_delivered() -> Iterator[None]:
    """Python's own SIGINT handler for the test: a suite started in the background (``cmd &``)
    inherits SIGINT ignored, and the signal a test sends would never arrive."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
