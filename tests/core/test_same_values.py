"""``ort_train_core.extending.same_values``: what the caches of validated settings (core's
trainers) and of built trainers (the scikit-learn adapter) compare between two fits."""

from __future__ import annotations

import numpy as np
import pytest

from ort_train_core.extending import same_values


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"alpha": 0.1, "w": np.array([1.0, 2.0])}, {"alpha": 0.1, "w": np.array([1.0, 2.0])}, True),
        ({"alpha": 0.1, "w": np.array([1.0, 2.0])}, {"alpha": 0.1, "w": np.array([1.0, 3.0])}, False),
        ({"alpha": 0.1}, {"alpha": 0.1, "l1_ratio": 0.15}, False),  # another key
        ({"max_iter": 5}, {"max_iter": 5.0}, False),  # equal, but another type
        ({"max_iter": 5}, {"max_iter": np.int64(5)}, False),
        ((0.1, "sgd", None), (0.1, "sgd", None), True),
        ((0.1, "sgd"), (0.1, "sgd", None), False),  # another length
        (((1, np.array([1.0, 2.0])),), ((1, np.array([1.0, 2.0])),), False),  # nested ==: raises
        ({"a": 1}, (1,), False),
    ],
)
def test_same_values(a: object, b: object, same: bool) -> None:
    assert same_values(a, b) is same  # type: ignore[arg-type]
    assert same_values(b, a) is same  # type: ignore[arg-type]


def test_same_object_is_same_without_comparing() -> None:
    class Refuses:
        def __eq__(self, other: object) -> bool:
            raise TypeError("no comparison")

        __hash__ = object.__hash__

    value = Refuses()
    assert same_values({"cb": value}, {"cb": value})
    assert not same_values({"cb": value}, {"cb": Refuses()})
