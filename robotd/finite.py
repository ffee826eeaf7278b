"""Whether an array of numbers holds only finite values, at a cost an act can afford.

A numpy reduction (`np.isfinite(a).all()`) sets up an iterator whatever the array's size:
on the cold cache an act runs on, that setup costs ~8 µs, several times what a chunk of
10 x 8 values needs. Small float arrays are summed as Python floats instead.
"""

from __future__ import annotations

import math

import numpy as np

SMALL = 4096  # values: up to this many, the Python sum is the cheaper check


def all_finite(a: np.ndarray) -> bool:
    """True when numeric array `a` holds no NaN and no infinity (integers and bools never
    do)."""
    if a.dtype.kind != "f":
        return True
    if a.size <= SMALL and math.isfinite(sum(a.ravel().tolist())):
        # A NaN or an infinity makes the sum non-finite. The converse needs the exact
        # check: float64 values near the largest double can overflow a finite sum (float16
        # and float32 ones, summed as doubles, cannot).
        return True
    return bool(np.isfinite(a).all())
