"""The main job: train ONNX models of scikit-learn's diabetes data with onnxruntime-training.

Trains a linear regression and an MLP (one fused onnxruntime run per step), prints the loss per
epoch and the test R2 beside scikit-learn's own model trained with the same settings, writes the
trained .onnx files and checks them with an onnxruntime InferenceSession.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np
import onnx
from skl2onnx import to_onnx
from sklearn.datasets import load_diabetes
from sklearn.linear_model import LinearRegression, SGDRegressor
from sklearn.metrics import r2_score
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from ort_train_core import LearningRateSGD, OrtGradientOptimizer, add_loss_output

EPOCHS = 100
BATCH = 16
ETA = 0.005


def load_data() -> tuple[np.ndarray, ...]:
    X, y = load_diabetes(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
    xs, ys = StandardScaler().fit(X_train), StandardScaler().fit(y_train[:, None])
    return (
        xs.transform(X_train).astype(np.float32),
        xs.transform(X_test).astype(np.float32),
        ys.transform(y_train[:, None]).ravel().astype(np.float32),
        ys.transform(y_test[:, None]).ravel().astype(np.float32),
    )


def print_curve(name: str, losses: list[float]) -> None:
    shown = sorted({0, 1, 2, 4, 9, 19, 49, len(losses) - 1} & set(range(len(losses))))
    print(f"  {name} training loss per epoch:")
    for e in shown:
        print(f"    epoch {e + 1:4d}  loss {losses[e]:.5f}")


def train(
    name: str,
    onx: onnx.ModelProto,
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_test: np.ndarray,
    y_test: np.ndarray,
    out: pathlib.Path,
) -> float:
    onx_loss = add_loss_output(onx)
    trainer = OrtGradientOptimizer(
        onx_loss,
        max_iter=EPOCHS,
        batch_size=BATCH,
        learning_rate=LearningRateSGD(eta0=ETA, learning_rate="constant"),
        shuffle=True,
        random_state=0,
    )
    start = time.perf_counter()
    trainer.fit(X_train, y_train)
    elapsed = time.perf_counter() - start
    print_curve(name, trainer.train_losses_)
    trained = trainer.get_trained_onnx()
    path = out / f"{name}.onnx"
    onnx.save(trained, path)
    # what a user deploys: the file alone, in an InferenceSession
    import onnxruntime

    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    pred = sess.run(None, {sess.get_inputs()[0].name: X_test})[0].ravel()
    r2 = float(r2_score(y_test, pred))
    print(f"  {name}: {trainer.n_iter_} epochs in {elapsed:.2f} s, wrote {path}")
    return r2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="demo_output", help="folder for the trained .onnx files")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    X_train, X_test, y_train, y_test = load_data()
    print(
        f"load_diabetes: {len(X_train)} training rows, {len(X_test)} test rows, {X_train.shape[1]} features"
    )

    # A linear model as ONNX: MatMul/Add (black_op avoids the LinearRegressor op, which has no
    # gradient); its weights start from zero.
    start_lin = LinearRegression().fit(X_train, y_train)
    start_lin.coef_[:] = 0
    start_lin.intercept_ = np.zeros((), dtype=np.float64)
    lin_onnx = to_onnx(start_lin, X_train[:1], black_op={"LinearRegressor"})
    # An MLP as ONNX, weights as scikit-learn initialises them (one iteration, no training
    # worth the name) so that both trainers start from the same point.
    mlp_kwargs = dict(
        hidden_layer_sizes=(16,),
        solver="sgd",
        learning_rate_init=ETA * 2,
        momentum=0.0,
        batch_size=BATCH,
        alpha=0.0,
        random_state=0,
    )
    start_mlp = MLPRegressor(max_iter=1, **mlp_kwargs)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start_mlp.fit(X_train, y_train)
        # scikit-learn's losses are 0.5 * squared error: twice our learning rate is the same step
        sk_lin = SGDRegressor(
            penalty=None,
            learning_rate="constant",
            eta0=ETA,
            max_iter=EPOCHS,
            tol=None,
            random_state=0,
        ).fit(X_train, y_train)
        sk_mlp = MLPRegressor(max_iter=EPOCHS, tol=0.0, n_iter_no_change=EPOCHS, **mlp_kwargs)
        sk_mlp.fit(X_train, y_train)
    mlp_onnx = to_onnx(start_mlp, X_train[:1])

    print("\nlinear regression (ort-train, full loop):")
    r2_lin = train("linear_regression", lin_onnx, X_train, y_train, X_test, y_test, out)
    print("\nMLP regression, 16 hidden units (ort-train, full loop):")
    r2_mlp = train("mlp_regression", mlp_onnx, X_train, y_train, X_test, y_test, out)

    print("\ntest R2            ort-train   scikit-learn")
    print(
        f"  linear           {r2_lin:9.4f}   {r2_score(y_test, sk_lin.predict(X_test)):12.4f}  (SGDRegressor)"
    )
    print(
        f"  MLP (16)         {r2_mlp:9.4f}   {r2_score(y_test, sk_mlp.predict(X_test)):12.4f}  (MLPRegressor)"
    )
    print(f"\ntrained models written to {out.resolve()}")


if __name__ == "__main__":
    main()
