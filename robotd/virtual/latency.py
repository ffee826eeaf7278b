"""Policy latency on the virtual clock: fixed, or a schedule giving each act its own.

A schedule maps the act's number in the run (0, 1, 2, ...) to its latency in seconds. Every
schedule here is a pure function of its arguments, so a run that uses one is as
reproducible as a run at a fixed latency: the same seed gives the same latencies, act by
act, whatever else happens in the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

LatencySchedule = Callable[[int], float]  # act number -> seconds (finite, >= 0)


def _check(value: float, what: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{what}: a latency must be a finite number of seconds >= 0, got {value}")
    return value


def jittered(base_s: float, spread: float = 0.5, seed: int = 0) -> LatencySchedule:
    """Each act's latency drawn uniformly from [base·(1 − spread), base·(1 + spread)], from a
    generator seeded by (seed, act number) alone."""
    base_s = _check(base_s, "jittered")
    if not 0 <= spread <= 1:
        raise ValueError(f"jittered: spread must be in 0..1, got {spread}")

    def latency(act: int) -> float:
        u = np.random.default_rng([seed, act]).uniform(-spread, spread)
        return base_s * (1.0 + float(u))

    return latency


def listed(latencies: Sequence[float]) -> LatencySchedule:
    """Act n takes latencies[n]; acts past the end take the last one."""
    values = [_check(v, "listed") for v in latencies]
    if not values:
        raise ValueError("listed: give at least one latency")
    return lambda act: values[min(act, len(values) - 1)]
