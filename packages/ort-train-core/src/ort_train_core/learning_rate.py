"""Learning rates: the schedule of eta over epochs and the update rule, written once.

The update rule is emitted as ONNX nodes (:meth:`BaseLearningRate.update_nodes`): the full loop
appends them to its fused step graph, the partial loop runs them as a small graph of their own.
Values that change during training (eta, Adam's bias-corrected step size and epsilon) are 0-d
inputs named in :attr:`scalar_names`, computed in double precision by :meth:`scalar_values`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from ._builder import NodeBuilder
from ._params import ParamsMixin

_SCHEDULES = ("constant", "invscaling", "optimal")


class BaseLearningRate(ParamsMixin):
    #: names of the optimizer states kept per weight (same shape as the weight, zeros at start)
    state_names: tuple[str, ...] = ()
    #: names of the 0-d inputs the update reads
    scalar_names: tuple[str, ...] = ("learning_rate",)

    eta0: float

    def eta(self, epoch: int) -> float:
        raise NotImplementedError

    def scalar_values(self, epoch: int, step: int) -> tuple[float, ...]:
        """Values of the scalar inputs at ``epoch`` (0-based) for the ``step``-th update (1-based)."""
        return (self.eta(epoch),)

    def update_nodes(
        self, b: NodeBuilder, weight: str, grad: str, states: list[str], scalars: dict[str, str]
    ) -> tuple[str, list[str]]:
        """Emits the update of one weight; returns the new weight and the new states."""
        raise NotImplementedError

    def validate(self) -> None:
        """Raises ValueError on parameters out of range (called at fit time)."""
        eta0: Any = self.eta0
        if (
            isinstance(eta0, bool)
            or not isinstance(eta0, numbers.Real)
            or not (float(eta0) > 0 and math.isfinite(eta0))
        ):
            raise ValueError(f"eta0 (the learning rate) must be a finite number > 0, got {eta0!r}")

    @property
    def scalars_change_every_step(self) -> bool:
        return False


class LearningRateSGD(BaseLearningRate):
    """Plain SGD: W <- W - eta g, eta following scikit-learn's schedules."""

    def __init__(
        self,
        eta0: float = 0.01,
        alpha: float = 0.0001,
        power_t: float = 0.25,
        learning_rate: str = "invscaling",
    ) -> None:
        self.eta0 = eta0
        self.alpha = alpha
        self.power_t = power_t
        self.learning_rate = learning_rate

    def validate(self) -> None:
        super().validate()
        if self.learning_rate not in _SCHEDULES:
            raise ValueError(
                f"learning_rate schedule must be one of {_SCHEDULES}, got {self.learning_rate!r}"
            )
        if self.alpha < 0 or self.power_t < 0:
            raise ValueError(f"alpha and power_t must be >= 0, got {self.alpha}, {self.power_t}")

    def eta(self, epoch: int) -> float:
        if self.learning_rate == "constant":
            return float(self.eta0)
        if self.learning_rate == "invscaling":
            return float(self.eta0) / float((epoch + 1) ** self.power_t)
        return float(self.eta0) / (1.0 + self.alpha * self.eta0 * epoch)

    def update_nodes(
        self, b: NodeBuilder, weight: str, grad: str, states: list[str], scalars: dict[str, str]
    ) -> tuple[str, list[str]]:
        step = b.op("Mul", [scalars["learning_rate"], grad], f"{weight}_step")
        return b.op("Sub", [weight, step], f"{weight}_new"), []


class LearningRateSGDNesterov(LearningRateSGD):
    """SGD with momentum (v <- mu v - eta g, W <- W + v) or Nesterov (W <- W + mu v - eta g)."""

    state_names = ("velocity",)

    def __init__(
        self,
        eta0: float = 0.01,
        alpha: float = 0.0001,
        power_t: float = 0.25,
        learning_rate: str = "invscaling",
        momentum: float = 0.9,
        nesterov: bool = True,
    ) -> None:
        super().__init__(eta0, alpha, power_t, learning_rate)
        self.momentum = momentum
        self.nesterov = nesterov

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")

    def update_nodes(
        self, b: NodeBuilder, weight: str, grad: str, states: list[str], scalars: dict[str, str]
    ) -> tuple[str, list[str]]:
        (velocity,) = states
        mu = b.const(self.momentum, "momentum")
        step = b.op("Mul", [scalars["learning_rate"], grad], f"{weight}_step")
        v_new = b.op("Sub", [b.op("Mul", [mu, velocity]), step], f"{weight}_velocity_new")
        move = b.op("Sub", [b.op("Mul", [mu, v_new]), step], f"{weight}_move") if self.nesterov else v_new
        return b.op("Add", [weight, move], f"{weight}_new"), [v_new]


class LearningRateAdam(BaseLearningRate):
    """Adam: W <- W - eta (m / (1 - b1^k)) / (sqrt(v / (1 - b2^k)) + eps), eta constant.

    The graph computes the same expression multiplied through by c = sqrt(1 - b2^k):
    W <- W - (eta c / (1 - b1^k)) m / (sqrt(v) + eps c), the two per-step factors computed in
    double on the host (:meth:`scalar_values`). That is 12 nodes per weight instead of 14 (no
    scaling of m and v by the bias corrections): on CPU, where the small MLPs' steps are mostly
    per-kernel overhead, about 5 us per step less for a one-hidden-layer MLP.
    """

    state_names = ("moment1", "moment2")
    scalar_names = ("step_size", "epsilon_hat")

    def __init__(
        self, eta0: float = 0.001, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8
    ) -> None:
        self.eta0 = eta0
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon

    def validate(self) -> None:
        super().validate()
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {self.epsilon}")

    def eta(self, epoch: int) -> float:
        return float(self.eta0)

    @property
    def scalars_change_every_step(self) -> bool:
        return True

    def scalar_values(self, epoch: int, step: int) -> tuple[float, ...]:
        # (eta sqrt(1 - b2^k) / (1 - b1^k), eps sqrt(1 - b2^k)), in double before the cast
        c2 = math.sqrt(1.0 - self.beta2**step)
        return (self.eta(epoch) * c2 / (1.0 - self.beta1**step), float(self.epsilon) * c2)

    def update_nodes(
        self, b: NodeBuilder, weight: str, grad: str, states: list[str], scalars: dict[str, str]
    ) -> tuple[str, list[str]]:
        m, v = states
        m_new = b.op(
            "Add",
            [
                b.op("Mul", [b.const(self.beta1, "beta1"), m]),
                b.op("Mul", [b.const(1.0 - self.beta1, "one_m_beta1"), grad]),
            ],
            f"{weight}_moment1_new",
        )
        g2 = b.op("Mul", [grad, grad])
        v_new = b.op(
            "Add",
            [
                b.op("Mul", [b.const(self.beta2, "beta2"), v]),
                b.op("Mul", [b.const(1.0 - self.beta2, "one_m_beta2"), g2]),
            ],
            f"{weight}_moment2_new",
        )
        denom = b.op("Add", [b.op("Sqrt", [v_new]), scalars["epsilon_hat"]])
        step = b.op("Div", [b.op("Mul", [m_new, scalars["step_size"]]), denom], f"{weight}_step")
        return b.op("Sub", [weight, step], f"{weight}_new"), [m_new, v_new]


def make_learning_rate(value: Any) -> BaseLearningRate:
    """'SGD', 'SGDNesterov'/'Nesterov', 'Adam', a float (constant SGD) or an instance (copied)."""
    if isinstance(value, BaseLearningRate):
        return value.clone()
    if isinstance(value, bool):
        raise TypeError(f"learning_rate must be a name, a float or a learning-rate object, not {value!r}")
    if isinstance(value, numbers.Real):
        if not (math.isfinite(value) and float(value) > 0):
            raise ValueError(f"learning_rate must be > 0 and finite, got {value!r}")
        return LearningRateSGD(eta0=float(value), learning_rate="constant")
    names: dict[str, type[BaseLearningRate]] = {
        "sgd": LearningRateSGD,
        "sgdnesterov": LearningRateSGDNesterov,
        "nesterov": LearningRateSGDNesterov,
        "adam": LearningRateAdam,
    }
    if isinstance(value, str) and value.lower() in names:
        return names[value.lower()]()
    raise ValueError(
        f"unknown learning_rate {value!r}: use 'SGD', 'SGDNesterov', 'Nesterov', 'Adam', a float, "
        "or a LearningRateSGD / LearningRateSGDNesterov / LearningRateAdam object"
    )
