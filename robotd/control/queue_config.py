"""How chunks are merged and played (the action queue's configuration), validated on
construction: a ValueError names the field."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

Timing = Literal["sync", "realtime"]
MergeMode = Literal["replace", "fade", "ensemble"]


@dataclass(frozen=True)
class QueueConfig:
    """How chunks are merged and played. Validated on construction (ValueError names the field)."""

    dim: int
    timing: Timing = "sync"
    open_loop_horizon: int | None = None  # sync: play at most this many rows of a chunk; None = all
    # realtime: ask when at most this many rows remain (and no act in flight); "auto": the
    # caller passes its predicted delay to should_ask
    refill_steps: int | Literal["auto"] = 4
    merge: MergeMode = "replace"
    fade_steps: int = 5
    ensemble_decay: float = 0.1  # weight_i = exp(-decay * i), i = 0 the oldest chunk
    grippers: tuple[int, ...] = ()  # never blended nor averaged: the newest chunk wins
    aligned: bool = True  # False = the naive baseline: rows from the chunk's start, no drop

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> ValueError:
            return ValueError(f"QueueConfig.{field}: {why} (got {getattr(self, field)!r})")

        if not _is_int(self.dim) or self.dim < 1:
            raise bad("dim", "must be an integer >= 1")
        if self.timing not in get_args(Timing):
            raise bad("timing", f"must be one of {get_args(Timing)}")
        if self.open_loop_horizon is not None and (
            not _is_int(self.open_loop_horizon) or self.open_loop_horizon < 1
        ):
            raise bad("open_loop_horizon", "must be None or an integer >= 1")
        if self.refill_steps != "auto" and (
            not _is_int(self.refill_steps) or self.refill_steps < 0  # type: ignore[operator]
        ):
            raise bad("refill_steps", "must be 'auto' or an integer >= 0")
        if self.merge not in get_args(MergeMode):
            raise bad("merge", f"must be one of {get_args(MergeMode)}")
        if not _is_int(self.fade_steps) or self.fade_steps < 1:
            raise bad("fade_steps", "must be an integer >= 1")
        if (
            not isinstance(self.ensemble_decay, int | float)
            or not math.isfinite(self.ensemble_decay)
            or self.ensemble_decay < 0
        ):
            raise bad("ensemble_decay", "must be a finite number >= 0")
        if not isinstance(self.grippers, tuple) or not all(_is_int(g) for g in self.grippers):
            raise bad("grippers", "must be a tuple of integer dims")
        if any(not 0 <= g < self.dim for g in self.grippers):
            raise bad("grippers", f"every dim must lie in 0..{self.dim - 1}")
        if len(set(self.grippers)) != len(self.grippers):
            raise bad("grippers", "has a duplicate dim")
        if not isinstance(self.aligned, bool):
            raise bad("aligned", "must be a bool")
        if self.merge != "replace" and (self.timing != "realtime" or not self.aligned):
            raise bad("merge", "fade and ensemble need timing='realtime' with aligned=True")


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


