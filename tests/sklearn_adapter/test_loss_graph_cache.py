"""Every fit of a linear drop-in starts from the same graph (zero weights): its loss graph is
built once per process for the same settings (``_base._LOSS_GRAPHS``), each trainer gets its own
copy, and the fits stay scikit-learn's (a cached fit equals one on an empty cache, which equals
SGDRegressor's steps)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sklearn.datasets import make_regression
from sklearn.linear_model import SGDRegressor

from ort_train_sklearn import OrtSGDRegressor, _base


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The penalties add_loss_output was called with, on an empty cache."""
    monkeypatch.setattr(_base, "_LOSS_GRAPHS", _base.LRUCache(16))
    seen: list[Any] = []
    original = _base.add_loss_output

    def counting(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("penalty"))
        return original(*args, **kwargs)

    monkeypatch.setattr(_base, "add_loss_output", counting)
    return seen


def test_fits_share_one_loss_graph_per_setting(calls: list[Any]) -> None:
    X, y = make_regression(60, 4, noise=5.0, random_state=0)
    params: dict[str, Any] = dict(batch_size=1, shuffle=False, max_iter=5, tol=None, alpha=0.01)
    first = OrtSGDRegressor(**params).fit(X, y)
    # the trainer owns a copy: an edit of it in place does not reach the next fit
    first._trainer.model_onnx.graph.initializer[0].raw_data = b"\x00" * 4
    second = OrtSGDRegressor(**params).fit(X, y)
    reference = SGDRegressor(**{k: v for k, v in params.items() if k != "batch_size"}).fit(X, y)
    np.testing.assert_allclose(second.coef_, reference.coef_, rtol=1e-4, atol=1e-5)
    assert len(calls) == 1
    OrtSGDRegressor(**{**params, "alpha": 0.1}).fit(X, y)  # another penalty: another graph
    assert len(calls) == 2
    assert calls[0] != calls[1]


def test_large_graphs_are_not_kept(calls: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph above MAX_CACHED_MODEL_BYTES (here the bound is set to 0) is built for each fit
    and not kept: each entry would hold copies of its weights."""
    monkeypatch.setattr(_base, "MAX_CACHED_MODEL_BYTES", 0)
    X, y = make_regression(60, 4, noise=5.0, random_state=0)
    params: dict[str, Any] = dict(batch_size=1, shuffle=False, max_iter=5, tol=None, alpha=0.01)
    fits = [OrtSGDRegressor(**params).fit(X, y) for _ in range(2)]
    assert len(calls) == 2
    assert len(_base._LOSS_GRAPHS._entries) == 0
    reference = SGDRegressor(**{k: v for k, v in params.items() if k != "batch_size"}).fit(X, y)
    for fit in fits:
        np.testing.assert_allclose(fit.coef_, reference.coef_, rtol=1e-4, atol=1e-5)
