"""Learning rates: the schedule of eta (over epochs, or over samples as scikit-learn's SGD
counts them) and the update rule, written once.

The update rule is emitted as ONNX nodes (:meth:`BaseLearningRate.update_nodes`): the full loop
appends them to its fused step graph, the partial loop runs them as a small graph of their own.
Values that change during training (eta, Adam's bias-corrected step size and epsilon) are 0-d
inputs named in :attr:`scalar_names`, computed in double precision by :meth:`scalar_values`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import onnx

from ._builder import NodeBuilder
from ._params import ParamsMixin, plain_repr

_SCHEDULES = ("constant", "invscaling", "optimal", "adaptive")

#: learning_rate='adaptive': the factor a plateau divides the rate by, and the rate below which
#: a plateau stops the fit instead (scikit-learn's)
ADAPTIVE_DIVISOR = 5.0
ADAPTIVE_MIN_RATE = 1e-6


class BaseLearningRate(ParamsMixin):
    """A learning-rate schedule and the update rule of an optimiser.

    Subclasses store their constructor arguments under the same names (scikit-learn's
    ``get_params``/``set_params`` protocol) and write the update once as ONNX nodes
    (:meth:`update_nodes`).

    Attributes
    ----------
    eta0 : float
        The initial learning rate.
    state_names : tuple of str
        The optimizer states kept per weight (same shape as the weight, zeros at the start):
        ``()`` for SGD, ``('velocity',)`` for momentum, ``('moment1', 'moment2')`` for Adam.
    scalar_names : tuple of str
        The 0-d inputs the update reads, whose values :meth:`scalar_values` gives.
    scalars_change_every_step : bool
        True when the scalars change at every step (Adam's bias corrections, per-sample
        schedules), False when only from one epoch to the next.
    """

    state_names: tuple[str, ...] = ()
    scalar_names: tuple[str, ...] = ("learning_rate",)

    eta0: float

    def eta(self, epoch: int) -> float:
        """The learning rate of an epoch.

        Parameters
        ----------
        epoch : int
            The epoch, from 0.

        Returns
        -------
        float
            The learning rate.
        """
        raise NotImplementedError

    def scalar_values(
        self, epoch: int, step: int, first_sample: int = 0, n_rows: int = 1
    ) -> tuple[float, ...]:
        """The values of the scalar inputs (:attr:`scalar_names`), computed in double.

        Parameters
        ----------
        epoch : int
            The epoch, from 0.
        step : int
            The number of the update, from 1.
        first_sample : int, default=0
            The samples seen before this update, over all epochs (per-sample schedules).
        n_rows : int, default=1
            The rows of this update's batch (per-sample schedules).

        Returns
        -------
        tuple of float
            One value per name of :attr:`scalar_names`.
        """
        return (self.eta(epoch),)

    def scalar_table(self, epoch: int, first_step: int, first_sample: int, rows: np.ndarray) -> np.ndarray:
        """The scalars of the consecutive updates of one epoch, one row per update.

        The fit computes them once an epoch, before its first step, where they change at every
        step (:attr:`scalars_change_every_step`): a step then reads its row instead of calling
        :meth:`scalar_values`. This default calls :meth:`scalar_values` once per update;
        built-in schedules compute the table vectorised (same values).

        Parameters
        ----------
        epoch : int
            The epoch, from 0.
        first_step : int
            The number of the epoch's first update, from 1.
        first_sample : int
            The samples seen before the epoch's first update, over all epochs.
        rows : numpy.ndarray of int
            The rows of each update's batch, in the order the updates run.

        Returns
        -------
        numpy.ndarray
            float64, shape ``(len(rows), len(scalar_names))``: row ``k`` is
            ``scalar_values(epoch, first_step + k, first_sample + sum(rows[:k]), rows[k])``.
        """
        starts = first_sample + np.cumsum(rows) - rows
        table = [
            self.scalar_values(epoch, first_step + k, int(start), int(n))
            for k, (start, n) in enumerate(zip(starts, rows))
        ]
        return np.array(table, dtype=np.float64).reshape(len(rows), len(self.scalar_names))

    def update_nodes(
        self, b: NodeBuilder, weight: str, grad: str, states: list[str], scalars: dict[str, str]
    ) -> tuple[str, list[str]]:
        """Emits the update of one weight.

        Parameters
        ----------
        b : NodeBuilder
            The builder that collects the nodes.
        weight : str
            The name of the weight.
        grad : str
            The name of its gradient.
        states : list of str
            The names of its optimizer states, in the order of :attr:`state_names`.
        scalars : dict of str to str
            The graph names of the scalar inputs, by name of :attr:`scalar_names`.

        Returns
        -------
        new_weight : str
            The name of the updated weight.
        new_states : list of str
            The names of the updated states, in the order of :attr:`state_names`.
        """
        raise NotImplementedError

    def validate(self) -> None:
        """Raises ValueError when a parameter is out of range; the trainers call it at fit time."""
        eta0: Any = self.eta0
        if (
            isinstance(eta0, bool)
            or not isinstance(eta0, numbers.Real)
            or not (float(eta0) > 0 and math.isfinite(eta0))
        ):
            raise ValueError(f"eta0 (the learning rate) must be a finite number > 0, got {plain_repr(eta0)}")

    #: whether :meth:`step_scalar_nodes` reads the count of steps done (Adam's bias corrections)
    needs_step_count: bool = False

    def step_scalar_nodes(self, b: NodeBuilder, eta: str, step: str | None) -> dict[str, str]:
        """Emits the scalar inputs of :meth:`update_nodes` from the step's learning rate, for
        a training step exported as one graph (:func:`~ort_train_core.export_training_step`)
        where no host computes :meth:`scalar_values`.

        Parameters
        ----------
        b : NodeBuilder
            The builder that collects the nodes.
        eta : str
            The 0-d learning-rate input: the factor of the gradient for SGD and momentum (the
            schedule's value, :meth:`scalar_values`), ``eta`` for Adam.
        step : str or None
            The 0-d int64 count of the steps done before this one (None unless
            :attr:`needs_step_count`).

        Returns
        -------
        dict of str to str
            The graph name of each of :attr:`scalar_names`.
        """
        return {"learning_rate": eta}

    @property
    def scalars_change_every_step(self) -> bool:
        return False

    @property
    def adaptive(self) -> bool:
        """Whether a plateau divides the rate (``learning_rate='adaptive'``) instead of
        stopping the fit."""
        return getattr(self, "learning_rate", None) == "adaptive"


class LearningRateSGD(BaseLearningRate):
    """Plain SGD: ``W <- W - eta g``, ``eta`` following scikit-learn's schedules.

    Parameters
    ----------
    eta0 : float, default=0.01
        The initial learning rate, > 0.
    alpha : float, default=0.0001
        The decay of the ``'optimal'`` schedule, >= 0.
    power_t : float, default=0.25
        The exponent of the ``'invscaling'`` schedule, >= 0.
    learning_rate : {'constant', 'invscaling', 'optimal', 'adaptive'}, default='invscaling'
        The schedule at ``t`` (from 0): ``eta0``; ``eta0 / (t + 1) ** power_t``;
        ``eta0 / (1 + alpha * eta0 * t)``; 'adaptive': ``eta0`` divided by 5 each time the
        stopping rule (``tol`` and ``n_iter_no_change``) would stop the fit, which stops only
        once the rate is <= 1e-6 (scikit-learn's; each fit starts again from ``eta0``).
    per_sample : bool or 'epoch', default=False
        What ``t`` counts. False: epochs, ``eta`` changes once per epoch. True: samples, as
        scikit-learn's SGD whose every row is one update: a batch of ``B`` rows that starts
        after ``s`` samples steps with the sum ``eta(s) + ... + eta(s + B - 1)`` times its
        gradient (the mean over its rows), the step of ``B`` one-row updates to first order
        (equal for a constant gradient). With ``B = 1`` it is scikit-learn's per-sample SGD.
        'epoch': samples, but ``eta`` changes once per epoch, at the samples seen before it
        (scikit-learn's MLP: ``eta0 / (t_ + 1) ** power_t``).

    Attributes
    ----------
    state_names : tuple of str
        ``()``: plain SGD keeps no state.
    scalar_names : tuple of str
        ``('learning_rate',)``.
    """

    def __init__(
        self,
        eta0: float = 0.01,
        alpha: float = 0.0001,
        power_t: float = 0.25,
        learning_rate: str = "invscaling",
        per_sample: bool | str = False,
    ) -> None:
        self.eta0 = eta0
        self.alpha = alpha
        self.power_t = power_t
        self.learning_rate = learning_rate
        self.per_sample = per_sample

    def validate(self) -> None:
        super().validate()
        if self.learning_rate not in _SCHEDULES:
            raise ValueError(
                f"learning_rate schedule must be one of {_SCHEDULES}, got {self.learning_rate!r}"
            )
        if self.per_sample not in (False, True, "epoch"):
            raise ValueError(f"per_sample must be False, True or 'epoch', got {self.per_sample!r}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        # a negative power_t grows the rate: scikit-learn deprecated it in 1.8 (an error in 1.10)
        if not self.power_t >= 0:
            raise ValueError(f"power_t must be >= 0, got {self.power_t}")

    def eta(self, epoch: int) -> float:
        """The learning rate at ``t = epoch`` (at sample ``epoch`` when ``per_sample``).

        Parameters
        ----------
        epoch : int
            ``t``, from 0.

        Returns
        -------
        float
            The learning rate.
        """
        return float(self._etas(np.array([epoch], dtype=np.float64))[0])

    def _etas(self, t: np.ndarray) -> np.ndarray:
        """The schedule at each ``t`` (float64 array), vectorised for per-sample batches."""
        eta0 = float(self.eta0)
        if self.learning_rate in ("constant", "adaptive"):  # the fit divides 'adaptive'
            return np.full_like(t, eta0)
        if self.learning_rate == "invscaling":
            out: np.ndarray = eta0 / (t + 1.0) ** float(self.power_t)
            return out
        out = eta0 / (1.0 + float(self.alpha) * eta0 * t)
        return out

    @property
    def scalars_change_every_step(self) -> bool:
        return self.per_sample is True

    def scalar_values(
        self, epoch: int, step: int, first_sample: int = 0, n_rows: int = 1
    ) -> tuple[float, ...]:
        if self.per_sample is False:
            return (self.eta(epoch),)
        if self.per_sample == "epoch":  # called at the start of each epoch
            return (self.eta(first_sample),)
        return (float(self.scalar_table(epoch, step, first_sample, np.array([n_rows]))[0, 0]),)

    def scalar_table(self, epoch: int, first_step: int, first_sample: int, rows: np.ndarray) -> np.ndarray:
        if self.per_sample is not True:
            return super().scalar_table(epoch, first_step, first_sample, rows)
        if self.learning_rate in ("constant", "adaptive"):
            return (float(self.eta0) * np.asarray(rows, dtype=np.float64)).reshape(-1, 1)
        # eta(t) summed over each batch's samples: one vectorised pass over the epoch's samples
        ends = np.cumsum(rows)
        t = np.arange(first_sample, first_sample + int(ends[-1]), dtype=np.float64)
        return np.add.reduceat(self._etas(t), ends - rows).reshape(-1, 1)

    def update_nodes(
        self, b: NodeBuilder, weight: str, grad: str, states: list[str], scalars: dict[str, str]
    ) -> tuple[str, list[str]]:
        step = b.op("Mul", [scalars["learning_rate"], grad], f"{weight}_step")
        return b.op("Sub", [weight, step], f"{weight}_new"), []


class LearningRateSGDNesterov(LearningRateSGD):
    """SGD with momentum or Nesterov's momentum.

    Momentum: ``v <- mu v - eta g``, ``W <- W + v``. Nesterov: ``v <- mu v - eta g``,
    ``W <- W + mu v - eta g``. ``eta`` follows the schedules of :class:`LearningRateSGD`.

    Parameters
    ----------
    eta0, alpha, power_t, learning_rate, per_sample
        The schedule, as :class:`LearningRateSGD`'s (same defaults).
    momentum : float, default=0.9
        ``mu``, in ``[0, 1)``.
    nesterov : bool, default=True
        Nesterov's update when True, plain momentum otherwise.

    Attributes
    ----------
    state_names : tuple of str
        ``('velocity',)``: ``v``, one per weight.
    scalar_names : tuple of str
        ``('learning_rate',)``.
    """

    state_names = ("velocity",)

    def __init__(
        self,
        eta0: float = 0.01,
        alpha: float = 0.0001,
        power_t: float = 0.25,
        learning_rate: str = "invscaling",
        momentum: float = 0.9,
        nesterov: bool = True,
        per_sample: bool | str = False,
    ) -> None:
        super().__init__(eta0, alpha, power_t, learning_rate, per_sample)
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
    """Adam: ``W <- W - eta (m / (1 - b1^k)) / (sqrt(v / (1 - b2^k)) + eps)``, ``eta`` constant.

    ``m <- b1 m + (1 - b1) g`` and ``v <- b2 v + (1 - b2) g^2``, ``k`` the step count from 1.
    The graph computes the same expression multiplied through by ``c = sqrt(1 - b2^k)``:
    ``W <- W - (eta c / (1 - b1^k)) m / (sqrt(v) + eps c)``, the two per-step factors computed
    in double on the host (:meth:`scalar_values`). That is 12 nodes per weight instead of 14
    (no scaling of ``m`` and ``v`` by the bias corrections): on CPU, the steps of small MLPs
    are mostly per-kernel overhead.

    Parameters
    ----------
    eta0 : float, default=0.001
        The learning rate, > 0.
    beta1 : float, default=0.9
        ``b1``, the decay of the first moment, in ``[0, 1)``.
    beta2 : float, default=0.999
        ``b2``, the decay of the second moment, in ``[0, 1)``.
    epsilon : float, default=1e-8
        ``eps``, > 0.

    Attributes
    ----------
    state_names : tuple of str
        ``('moment1', 'moment2')``: ``m`` and ``v``, one each per weight.
    scalar_names : tuple of str
        ``('step_size', 'epsilon_hat')``: ``eta c / (1 - b1^k)`` and ``eps c``.
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

    def scalar_values(
        self, epoch: int, step: int, first_sample: int = 0, n_rows: int = 1
    ) -> tuple[float, ...]:
        # (eta sqrt(1 - b2^k) / (1 - b1^k), eps sqrt(1 - b2^k)), in double before the cast
        return tuple(float(v) for v in self.scalar_table(epoch, step, first_sample, np.ones(1))[0])

    def scalar_table(self, epoch: int, first_step: int, first_sample: int, rows: np.ndarray) -> np.ndarray:
        k = np.arange(first_step, first_step + len(rows), dtype=np.float64)
        c2 = np.sqrt(1.0 - float(self.beta2) ** k)
        step_size = self.eta(epoch) * c2 / (1.0 - float(self.beta1) ** k)
        return np.stack([step_size, float(self.epsilon) * c2], axis=1)

    needs_step_count = True

    def step_scalar_nodes(self, b: NodeBuilder, eta: str, step: str | None) -> dict[str, str]:
        # scalar_table's expressions, in double in the graph as on the host (k = step + 1)
        assert step is not None
        f64 = onnx.TensorProto.DOUBLE
        k = b.op("Add", [b.cast(step, f64), b.const(1.0, "one", dtype=np.float64)], "adam_k")
        power = {
            name: b.op("Pow", [b.const(float(getattr(self, name)), name, dtype=np.float64), k])
            for name in ("beta1", "beta2")
        }
        one = b.const(1.0, "one", dtype=np.float64)
        c2 = b.op("Sqrt", [b.op("Sub", [one, power["beta2"]])], "adam_c2")
        size = b.op("Div", [b.op("Mul", [b.cast(eta, f64), c2]), b.op("Sub", [one, power["beta1"]])])
        eps = b.op("Mul", [b.const(float(self.epsilon), "epsilon", dtype=np.float64), c2])
        return {"step_size": b.cast(size, hint="step_size"), "epsilon_hat": b.cast(eps, hint="epsilon_hat")}

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
    """A learning-rate object from a trainer's ``learning_rate`` parameter.

    Parameters
    ----------
    value : str, float or BaseLearningRate
        ``'SGD'``, ``'SGDNesterov'`` or ``'Nesterov'``, ``'Adam'`` (any case; default
        parameters), a float (``LearningRateSGD(eta0=value, learning_rate='constant')``) or a
        learning-rate object, which is copied.

    Returns
    -------
    BaseLearningRate
        A new object.

    Raises
    ------
    TypeError
        A bool.
    ValueError
        An unknown name, or a float that is not finite and > 0.
    """
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
