"""robotd.finite.all_finite agrees with numpy's exact check on every array the links see."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from robotd.finite import SMALL, all_finite

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int64, np.uint16, np.bool_]


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from(DTYPES),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=12),
        elements={"allow_nan": True, "allow_infinity": True},
    )
)
def test_agrees_with_numpy(a: np.ndarray) -> None:
    assert all_finite(a) == bool(np.isfinite(a).all())


def test_finite_doubles_whose_sum_overflows_are_finite() -> None:
    """The sum of large finite float64 values overflows: the exact check decides."""
    a = np.full((10, 8), np.finfo(np.float64).max)
    assert all_finite(a)
    a[3, 4] = np.nan
    assert not all_finite(a)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("size", [1, 80, SMALL, SMALL + 1])
def test_one_bad_value_anywhere_is_found(bad: float, size: int) -> None:
    for dtype in (np.float16, np.float32, np.float64):
        a = np.ones(size, dtype=dtype)
        a[size // 2] = bad
        assert not all_finite(a)
        assert not all_finite(a[::-1].reshape(1, -1))  # a strided view


def test_inf_minus_inf_in_one_array_is_not_finite() -> None:
    assert not all_finite(np.array([np.inf, -np.inf], dtype=np.float32))
