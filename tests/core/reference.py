"""A pure-numpy (float64) implementation of DESIGN.md's math contract.

Nothing here imports ``ort_train_core``: the forward pass, the per-row losses, the weighted
reduction, the penalties, the gradients (backpropagation written by hand), the learning-rate
schedules, the updates and the epoch bookkeeping are all written independently, so that the
tests compare the package against the contract and not against itself.

Models (parameters are a dict name -> array):

* ``'linear'``: z = X @ coef + intercept
* ``'mlp'``: z = relu(X @ W1 + b1) @ W2 + b2

followed by a head: ``'identity'`` (f = z), ``'sigmoid'`` (one column) or ``'softmax'``
(several columns, along axis 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LINEAR_WEIGHTS = ("coef", "intercept")
MLP_WEIGHTS = ("W1", "b1", "W2", "b2")


# ---- forward / backward of the networks --------------------------------------------------------
def forward(model: str, params: Mapping[str, np.ndarray], X: np.ndarray) -> tuple[np.ndarray, dict]:
    """The network's output z (before the head) and what backward needs."""
    if model == "linear":
        return X @ params["coef"] + params["intercept"], {"X": X}
    if model == "mlp":
        a = X @ params["W1"] + params["b1"]
        h = np.maximum(a, 0.0)
        return h @ params["W2"] + params["b2"], {"X": X, "a": a, "h": h}
    raise ValueError(model)


def backward(model: str, params: Mapping[str, np.ndarray], cache: dict, dz: np.ndarray) -> dict:
    """Gradients of the weights given dObjective/dz."""
    X = cache["X"]
    if model == "linear":
        return {"coef": X.T @ dz, "intercept": dz.sum(axis=0)}
    if model == "mlp":
        h, a = cache["h"], cache["a"]
        grads = {"W2": h.T @ dz, "b2": dz.sum(axis=0)}
        da = (dz @ params["W2"].T) * (a > 0)
        grads["W1"] = X.T @ da
        grads["b1"] = da.sum(axis=0)
        return grads
    raise ValueError(model)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def head_forward(head: str, z: np.ndarray) -> np.ndarray:
    if head == "identity":
        return z
    if head == "sigmoid":
        return _sigmoid(z)
    if head == "softmax":
        return _softmax(z)
    raise ValueError(head)


def head_backward(head: str, f: np.ndarray, df: np.ndarray) -> np.ndarray:
    """dz from df, f being the head's output."""
    if head == "identity":
        return df
    if head == "sigmoid":
        return df * f * (1.0 - f)
    if head == "softmax":
        return f * (df - (df * f).sum(axis=1, keepdims=True))
    raise ValueError(head)


# ---- per-row losses ----------------------------------------------------------------------------
@dataclass
class Score:
    """One of add_loss_output's scores with its keyword arguments."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: filled by row_loss for 'log': how many true-class probabilities were clipped (gradient
    #: 0) and how many were not, over all the batches seen so far
    n_clipped: int = 0
    n_inside: int = 0

    def row_loss(self, f: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-row loss l (n,) and dl/df (same shape as f)."""
        name = self.name
        if name in ("squared_error", "absolute_error", "elastic"):
            d = f - y.reshape(f.shape)
            if name == "squared_error":
                return (d**2).sum(axis=1), 2.0 * d
            if name == "absolute_error":
                return np.abs(d).sum(axis=1), np.sign(d)
            a = self.kwargs.get("l1_weight", 0.5)
            b = self.kwargs.get("l2_weight", 0.5)
            return (a * np.abs(d) + b * d**2).sum(axis=1), a * np.sign(d) + 2.0 * b * d
        n = f.shape[0]
        labels = y.astype(np.int64).reshape(n)
        rows = np.arange(n)
        if name == "log":
            eps = self.kwargs.get("eps", 1e-5)
            inside = (f > eps) & (f < 1.0 - eps)  # the clip's gradient is 0 where it clips
            p = np.clip(f, eps, 1.0 - eps)
            used = inside if f.shape[1] == 1 else inside[rows, labels]
            self.n_inside += int(used.sum())
            self.n_clipped += int(used.size - used.sum())
            if f.shape[1] == 1:
                yf = labels.astype(np.float64)[:, None]
                pt = yf * p + (1.0 - yf) * (1.0 - p)
                dl_dp = -(2.0 * yf - 1.0) / pt
                return -np.log(pt[:, 0]), dl_dp * inside
            pt = p[rows, labels]
            df = np.zeros_like(f)
            df[rows, labels] = -1.0 / pt
            return -np.log(pt), df * inside
        if name == "cross_entropy":
            if f.shape[1] == 1:
                z = f[:, 0]
                yf = labels.astype(np.float64)
                softplus = np.logaddexp(0.0, z)
                return softplus - yf * z, (_sigmoid(z) - yf)[:, None]
            m = f.max(axis=1, keepdims=True)
            lse = (m + np.log(np.exp(f - m).sum(axis=1, keepdims=True)))[:, 0]
            onehot = np.zeros_like(f)
            onehot[rows, labels] = 1.0
            return lse - f[rows, labels], _softmax(f) - onehot
        raise ValueError(name)


# ---- penalties ---------------------------------------------------------------------------------
def normalise_penalty(penalty: Mapping[str, Any] | None) -> dict[str, tuple[float, float]]:
    """{'W': {'l1': a, 'l2': b}} or {'W': b} (l2 only) -> {'W': (l1, l2)}."""
    out = {}
    for name, value in (penalty or {}).items():
        if isinstance(value, Mapping):
            out[name] = (float(value.get("l1", 0.0)), float(value.get("l2", 0.0)))
        else:
            out[name] = (0.0, float(value))
    return out


# ---- the objective of one batch ----------------------------------------------------------------
@dataclass
class Problem:
    model: str  # 'linear' or 'mlp'
    head: str  # 'identity', 'sigmoid', 'softmax'
    score: Score
    penalty: dict[str, tuple[float, float]] = field(default_factory=dict)
    reduction: str = "mean"

    def objective(
        self, params: Mapping[str, np.ndarray], X: np.ndarray, y: np.ndarray, s: np.ndarray
    ) -> tuple[float, dict[str, np.ndarray]]:
        """L + P on one batch and its gradient for every weight."""
        z, cache = forward(self.model, params, X)
        f = head_forward(self.head, z)
        rows, df_rows = self.score.row_loss(f, y)
        if self.reduction == "mean":
            scale = s / s.sum()
        elif self.reduction == "sum":
            scale = s
        else:
            raise ValueError(self.reduction)
        value = float((scale * rows).sum())
        df = df_rows * scale[:, None]
        grads = backward(self.model, params, cache, head_backward(self.head, f, df))
        for name, (l1, l2) in self.penalty.items():
            W = params[name]
            value += l1 * np.abs(W).sum() + l2 * (W**2).sum()
            grads[name] = grads[name] + l1 * np.sign(W) + 2.0 * l2 * W
        return value, grads


# ---- learning rates and updates ----------------------------------------------------------------
@dataclass
class Optimizer:
    """kind: 'sgd', 'momentum', 'nesterov' or 'adam'; schedule: 'constant', 'invscaling',
    'optimal' (Adam's eta is constant)."""

    kind: str
    eta0: float
    schedule: str = "constant"
    alpha: float = 0.0001
    power_t: float = 0.25
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8

    def eta(self, epoch: int) -> float:
        if self.kind == "adam" or self.schedule == "constant":
            return self.eta0
        if self.schedule == "invscaling":
            return self.eta0 / (epoch + 1) ** self.power_t
        if self.schedule == "optimal":
            return self.eta0 / (1.0 + self.alpha * self.eta0 * epoch)
        raise ValueError(self.schedule)

    def init_state(self, W: np.ndarray) -> dict[str, np.ndarray]:
        if self.kind in ("momentum", "nesterov"):
            return {"v": np.zeros_like(W)}
        if self.kind == "adam":
            return {"m": np.zeros_like(W), "v": np.zeros_like(W)}
        return {}

    def update(self, W: np.ndarray, g: np.ndarray, state: dict, eta: float, k: int) -> np.ndarray:
        """The new W; ``state`` updated in place; k = step count from 1."""
        if self.kind == "sgd":
            return W - eta * g
        if self.kind == "momentum":
            state["v"] = self.momentum * state["v"] - eta * g
            return W + state["v"]
        if self.kind == "nesterov":
            state["v"] = self.momentum * state["v"] - eta * g
            return W + self.momentum * state["v"] - eta * g
        if self.kind == "adam":
            b1, b2 = self.beta1, self.beta2
            state["m"] = b1 * state["m"] + (1 - b1) * g
            state["v"] = b2 * state["v"] + (1 - b2) * g**2
            m_hat = state["m"] / (1 - b1**k)
            v_hat = state["v"] / (1 - b2**k)
            return W - eta * m_hat / (np.sqrt(v_hat) + self.epsilon)
        raise ValueError(self.kind)


# ---- the training loop -------------------------------------------------------------------------
def train(
    problem: Problem,
    optimizer: Optimizer,
    params: Mapping[str, np.ndarray],
    X: np.ndarray,
    y: np.ndarray,
    sample_weight: np.ndarray | None,
    n_epochs: int,
    batch_size: int,
    weights_to_train: list[str] | None = None,
) -> tuple[dict[str, np.ndarray], list[float]]:
    """Weights after ``n_epochs`` (consecutive batches, no shuffling) and the epoch losses."""
    params = {k: np.asarray(v, dtype=np.float64).copy() for k, v in params.items()}
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    y = y.astype(np.float64) if np.issubdtype(y.dtype, np.floating) else y
    n = X.shape[0]
    s = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    trained = list(params) if weights_to_train is None else list(weights_to_train)
    states = {w: optimizer.init_state(params[w]) for w in trained}
    bounds = [(b, min(b + batch_size, n)) for b in range(0, n, batch_size)]
    k = 0
    epoch_losses = []
    for epoch in range(n_epochs):
        eta = optimizer.eta(epoch)
        values, totals = [], []
        for b, e in bounds:
            value, grads = problem.objective(params, X[b:e], y[b:e], s[b:e])
            values.append(value)
            totals.append(s[b:e].sum())
            k += 1
            for w in trained:
                params[w] = optimizer.update(params[w], grads[w], states[w], eta, k)
        epoch_losses.append(float(np.dot(values, totals) / np.sum(totals)))
    return params, epoch_losses
