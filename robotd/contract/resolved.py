"""A contract turned into whole steps at a control rate: what the window planner reads."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ResolvedStream:
    """A stream in whole steps: exactly one of `at` (ascending ints <= 0) or `every` (>= 1).
    A stream that declared neither resolves to at=(0,)."""

    at: tuple[int, ...] | None
    every: int | None


@dataclass(frozen=True)
class ResolvedObservations:
    """An `Observations` turned into steps at a control rate; what the window planner reads.

    `at` windows need not contain 0: the act's own step is in every window regardless
    (it may then read no key). `max_lookback` is the largest |offset| of the at-windows,
    i.e. how many past steps a robot-side ring must keep for them. Every-streams read the
    steps since the previous act, so their ring need is the act interval (horizon or
    latency), which only the caller knows and must add.
    """

    streams: Mapping[str, ResolvedStream]
    pad: Literal["repeat_first", "drop"]
    when_behind: Literal["wait", "drop_oldest"]
    hz: float

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(sorted(self.streams))

    @property
    def max_lookback(self) -> int:
        return max((-s.at[0] for s in self.streams.values() if s.at), default=0)


def _to_steps(seconds: float, hz: float) -> int:
    """Round to nearest, ties away from zero (so -0.05 s at 10 Hz is step -1)."""
    x = seconds * hz
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


