"""
.. _example-benchmark-sklearn:

Benchmark against scikit-learn
==============================

:class:`ort_train_sklearn.OrtMLPRegressor` against scikit-learn's ``MLPRegressor`` with the
same parameters, for a few dataset sizes: time per epoch. The sizes are small so that the
documentation builds quickly; ``nox -s bench`` runs the full benchmark (see :doc:`/benchmarks`).
Timings depend on the machine that built this page and on what else it was running.
"""

import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import make_regression
from sklearn.neural_network import MLPRegressor

from ort_train_sklearn import OrtMLPRegressor

EPOCHS = 5
params = dict(
    hidden_layer_sizes=(32,),
    solver="adam",
    batch_size=100,
    learning_rate_init=1e-3,
    max_iter=EPOCHS,
    tol=0.0,
    n_iter_no_change=EPOCHS + 1,
    shuffle=False,
    random_state=0,
)


def best_time(estimator, X, y, repeat=3):
    """Best of ``repeat`` fits after one warm-up fit (it builds ort-train's graphs)."""
    times = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 5 epochs do not converge
        estimator.fit(X, y)
        for _ in range(repeat):
            begin = time.perf_counter()
            estimator.fit(X, y)
            times.append(time.perf_counter() - begin)
    return min(times)


sizes = [500, 2000, 8000]
rows = []
for n in sizes:
    X, y = make_regression(n_samples=n, n_features=20, noise=5.0, random_state=0)
    X = X.astype(np.float32)
    y = (y / y.std()).astype(np.float32)
    t_ours = best_time(OrtMLPRegressor(**params), X, y)
    t_sk = best_time(MLPRegressor(**params), X, y)
    rows.append((n, t_ours / EPOCHS, t_sk / EPOCHS))
    ms_ours, ms_sk = t_ours / EPOCHS * 1e3, t_sk / EPOCHS * 1e3
    print(
        f"n={n:5d}  ms per epoch: ort-train {ms_ours:7.2f}  scikit-learn {ms_sk:7.2f}"
    )

# %%
# Both fit the same network from the same initial weights: the losses agree.

ours = OrtMLPRegressor(**params)
theirs = MLPRegressor(**params)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ours.fit(X, y)
    theirs.fit(X, y)
print("loss per epoch, ort-train:   ", np.round(ours.loss_curve_, 5))
print("loss per epoch, scikit-learn:", np.round(theirs.loss_curve_, 5))

# %%
# Time per epoch.

rows = np.array(rows)
fig, ax = plt.subplots(1, 2, figsize=(11, 4))
ax[0].plot(rows[:, 0], rows[:, 1] * 1e3, "o-", label="OrtMLPRegressor")
ax[0].plot(rows[:, 0], rows[:, 2] * 1e3, "o-", label="MLPRegressor")
ax[0].set_xscale("log")
ax[0].set_yscale("log")
ax[0].set_xlabel("rows")
ax[0].set_ylabel("ms per epoch")
ax[0].legend()
ax[0].set_title("MLP 20-32-1, Adam, batch 100")
ax[1].bar([str(int(n)) for n in rows[:, 0]], rows[:, 2] / rows[:, 1])
ax[1].axhline(1, color="k", lw=1)
ax[1].set_xlabel("rows")
ax[1].set_ylabel("speedup (scikit-learn time / ours)")
fig.tight_layout()
