"""On text-like sparse X (short tf-idf rows of Zipf-like words) the SGD classifier at its
defaults stops within 1.5x of scikit-learn's epochs with its test accuracy (issue 30 item 8):
the intercept's steps damped as scikit-learn's on sparse X, and batches sized for the
padded-row path."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDClassifier

from ort_train_sklearn import OrtSGDClassifier


def _text_like(rows: int, features: int, density: float, seed: int) -> tuple[sp.csr_matrix, np.ndarray]:
    """Unit-norm rows of exponential weights on Zipf-like word indices; linear labels."""
    rng = np.random.default_rng(seed)
    rows_of = np.repeat(np.arange(rows), rng.poisson(density * features, rows))
    p = 1.0 / (np.arange(features) + 20.0)
    words = rng.choice(features, rows_of.size, p=p / p.sum())
    X = sp.csr_matrix((rng.exponential(1.0, rows_of.size), (rows_of, words)), shape=(rows, features))
    X = sp.csr_matrix(sp.diags(1 / np.maximum(sp.linalg.norm(X, axis=1), 1e-12)) @ X)
    return X, (X @ rng.standard_normal(features) > 0).astype(int)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_text_like_epochs_and_accuracy_near_scikit_learns(seed: int) -> None:
    X, y = _text_like(5000, 20000, 2.5e-3, seed)
    train, test = slice(0, 4000), slice(4000, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        theirs = SGDClassifier(random_state=seed).fit(X[train], y[train])
        ours = OrtSGDClassifier(random_state=seed).fit(X[train], y[train])
    assert ours._trains_padded
    assert ours.n_iter_ <= 1.5 * theirs.n_iter_
    assert abs(ours.score(X[test], y[test]) - theirs.score(X[test], y[test])) <= 0.02
