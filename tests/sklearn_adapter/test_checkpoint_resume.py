"""Estimators write checkpoints and resume() ends where an uninterrupted fit ends."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_diabetes
from sklearn.preprocessing import StandardScaler

from ort_train_sklearn import OrtMLPRegressor, OrtSGDClassifier


def _diabetes() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_diabetes(return_X_y=True)
    return StandardScaler().fit_transform(X).astype(np.float32), ((y - y.mean()) / y.std()).astype(np.float32)


@pytest.mark.parametrize("training", ["full", "partial"])
def test_mlp_resume_equals_an_uninterrupted_fit(tmp_path, training):
    X, y = _diabetes()
    params = dict(
        hidden_layer_sizes=(8,),
        solver="adam",
        batch_size=32,
        random_state=0,
        shuffle=True,
        tol=None,
        training=training,
    )
    straight = OrtMLPRegressor(max_iter=6, **params).fit(X, y)
    # a run stopped after 3 epochs (its checkpoint is the state at the end of epoch 3) ...
    OrtMLPRegressor(max_iter=3, checkpoint_dir=tmp_path, **params).fit(X, y)
    # ... then resumed by a new estimator with the full epoch budget
    resumed = OrtMLPRegressor(max_iter=6, checkpoint_dir=tmp_path, **params).resume(X, y)
    assert resumed.n_iter_ == 6
    np.testing.assert_allclose(resumed.loss_curve_, straight.loss_curve_, rtol=1e-6)
    for got, expected in zip(resumed.coefs_ + resumed.intercepts_, straight.coefs_ + straight.intercepts_):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert not np.allclose(straight.coefs_[0], OrtMLPRegressor(max_iter=3, **params).fit(X, y).coefs_[0])


def test_classifier_resume_without_checkpoint_is_a_fit_and_without_folder_refused(tmp_path):
    X, y = _diabetes()
    labels = (y > 0).astype(int)
    params = dict(max_iter=4, random_state=0, tol=None)
    fitted = OrtSGDClassifier(**params).fit(X, labels)
    resumed = OrtSGDClassifier(checkpoint_dir=tmp_path / "new", **params).resume(X, labels)
    np.testing.assert_allclose(resumed.coef_, fitted.coef_, rtol=1e-6)
    assert (tmp_path / "new" / "checkpoint.npz").exists()
    with pytest.raises(ValueError, match="checkpoint_dir"):
        OrtSGDClassifier(**params).resume(X, labels)


@pytest.mark.parametrize("estimator_class", [OrtMLPRegressor, OrtSGDClassifier])
def test_early_stopping_with_checkpoints_is_refused_before_training(tmp_path, estimator_class):
    """The validation scores that decide the stop are not in the checkpoints: a resumed fit would
    stop elsewhere than the uninterrupted one, so the pair is refused up front, folder untouched."""
    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    if estimator_class is OrtSGDClassifier:
        y = (y > np.median(y)).astype(int)
    est = estimator_class(early_stopping=True, checkpoint_dir=tmp_path / "ckpt", max_iter=3)
    for call in (est.fit, est.resume):
        with pytest.raises(ValueError, match="early_stopping with checkpoint_dir"):
            call(X, y)
    assert not (tmp_path / "ckpt").exists()
    assert not hasattr(est, "n_iter_")
