"""A policy's answer made fit for the control lane, on the async lane: bounded, finite,
shaped for this robot and at the control rate.

Nothing a worker sends can make the control lane decode more than one bounded chunk in a
tick: every chunk is checked here, before it goes down, against `ChunkLimits` (rows,
columns, the length after resampling to the control rate, and values far outside the
joints' limits), and refused whole with a reason otherwise.

Why values are checked here as well as by the shield: the shield clips a target a bit out
of limits and rejects one further out, and five rejections in a row latch FAULT. A value
no joint could mean (1e30, or 1e6 rad on a joint limited to +-3) is a worker's nonsense,
not a motion to stop: the act is refused, the robot holds or plays what it has queued,
and the episode goes on with the next act. The margin is the joint's own span (upper -
lower) beyond either limit: anything closer is still the shield's to clip or reject.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from robotd.contract import Actions

if TYPE_CHECKING:
    from robotd.config import Config

MIN_ACTIONS_HZ = 0.1  # rows slower than this, or faster than MAX_ACTIONS_HZ, are refused
MAX_ACTIONS_HZ = 10_000.0


class ChunkRefused(ValueError):
    """A chunk the robot will not play; the message says why."""


@dataclass(frozen=True)
class ChunkLimits:
    """What one chunk may hold: rows (as answered and at the control rate), columns, and
    (with `names`) values no farther outside each joint's [lower, upper] than its span.

    `modes[j]` says how a value moves joint j: "absolute" (a target), "delta" (a step from
    the last target) or "velocity" (units/s, a step of value / `hz`). A step is far when it
    takes the joint more than a span outside its limits wherever within them it stands."""

    max_rows: int = 1024
    dim: int = 0  # the robot's joints; 0 = not checked here
    names: tuple[str, ...] = ()  # empty: values are not checked against limits here
    lower: tuple[float, ...] = ()
    upper: tuple[float, ...] = ()
    modes: tuple[str, ...] = ()
    hz: float = 0.0  # the control rate (velocity rows)

    def __post_init__(self) -> None:
        n = len(self.names)
        if n and not (len(self.lower) == len(self.upper) == len(self.modes) == n == self.dim):
            raise ValueError("ChunkLimits: names, lower, upper and modes need one per joint")
        if "velocity" in self.modes and not self.hz > 0:
            raise ValueError("ChunkLimits: velocity rows need the control rate (hz > 0)")

    @classmethod
    def for_robot(cls, cfg: Config) -> ChunkLimits:
        """This robot's limits: policy.max_chunk_rows, its joints, their limits and how a
        row moves each (control.control_mode; grippers are commanded absolutely always)."""
        j, mode = cfg.joints, cfg.control.control_mode
        grippers = set(j.grippers)
        return cls(
            max_rows=cfg.policy.max_chunk_rows,
            dim=len(j.names),
            names=tuple(j.names),
            lower=tuple(j.lower),
            upper=tuple(j.upper),
            modes=tuple("absolute" if n in grippers else mode for n in j.names),
            hz=cfg.control.hz,
        )

    @cached_property
    def _far(self) -> tuple[np.ndarray, np.ndarray]:
        """Per column, the values beyond which a row is refused (see the class)."""
        lo, hi = np.array(self.lower, dtype=np.float64), np.array(self.upper, dtype=np.float64)
        span = hi - lo
        step = np.array([_per_tick(m, self.hz) for m in self.modes], dtype=np.float64)
        moved = step > 0  # delta / velocity: a step of up to 2 spans, scaled to the row's unit
        far_lo = np.where(moved, -2 * span / np.where(moved, step, 1.0), lo - span)
        far_hi = np.where(moved, 2 * span / np.where(moved, step, 1.0), hi + span)
        return far_lo, far_hi

    def check_values(self, rows: np.ndarray) -> None:
        """ChunkRefused naming the first value (row, joint, limits) far outside its joint's
        limits; rows are finite, one column per joint. Nothing is checked without names."""
        if not self.names:
            return
        far_lo, far_hi = self._far
        bad = (rows < far_lo) | (rows > far_hi)
        if not bad.any():
            return
        i, j = (int(x) for x in np.argwhere(bad)[0])
        v, lo, hi, mode = float(rows[i, j]), self.lower[j], self.upper[j], self.modes[j]
        where = f"row {i}, joint {self.names[j]!r}"
        limits = f"its limits {lo:g}..{hi:g}"
        if mode == "absolute":
            raise ChunkRefused(
                f"{where}: {v:g} is far outside {limits} (more than their span, "
                f"{hi - lo:g}, beyond them)"
            )
        unit = " units/s" if mode == "velocity" else ""
        raise ChunkRefused(
            f"{where}: a {mode} of {v:g}{unit} takes it far outside {limits} wherever it "
            f"stands (control_mode {mode}: at most ±{far_hi[j]:g}{unit})"
        )

    def check_hz(self, hz: float | None, control_hz: float) -> None:
        """An actions.hz outside a sane range is refused (at the handshake)."""
        if hz is None:
            return
        if not (math.isfinite(hz) and MIN_ACTIONS_HZ <= hz <= MAX_ACTIONS_HZ):
            raise ChunkRefused(
                f"actions.hz {hz:g} is outside {MIN_ACTIONS_HZ:g}..{MAX_ACTIONS_HZ:g} Hz"
            )
        if self.resampled_rows(self.max_rows, hz, control_hz) > 4 * self.max_rows:
            raise ChunkRefused(
                f"actions.hz {hz:g} against a control rate of {control_hz:g} Hz would stretch "
                f"a chunk more than 4-fold"
            )

    @staticmethod
    def resampled_rows(rows: int, from_hz: float, to_hz: float) -> int:
        if rows < 2 or abs(from_hz - to_hz) < 1e-9:
            return rows
        return math.floor((rows - 1) / from_hz * to_hz + 1e-9) + 1


def _per_tick(mode: str, hz: float) -> float:
    """What a row's value moves a joint by in one tick, per unit (0: it is a target)."""
    if mode == "delta":
        return 1.0
    if mode == "velocity":
        return 1.0 / hz if hz > 0 else 0.0
    return 0.0


def resample(rows: np.ndarray, from_hz: float, to_hz: float) -> np.ndarray:
    """Rows played at from_hz, linearly resampled to the control rate (row 0 stays row 0)."""
    if abs(from_hz - to_hz) < 1e-9 or rows.shape[0] < 2:
        return rows
    n = ChunkLimits.resampled_rows(rows.shape[0], from_hz, to_hz)
    return rows_at(rows, from_hz, np.arange(n) / to_hz)


def rows_at(rows: np.ndarray, from_hz: float, times: np.ndarray) -> np.ndarray:
    """`rows` (row i played at i / from_hz) linearly interpolated at `times` (s), clamped to
    the first and the last row outside them; (0, D) when either is empty."""
    if rows.shape[0] == 0 or times.size == 0:
        return np.zeros((0, rows.shape[1]))
    t_src = np.arange(rows.shape[0]) / from_hz
    return np.stack([np.interp(times, t_src, rows[:, d]) for d in range(rows.shape[1])], axis=1)


def prepare(
    rows: np.ndarray, actions: Actions | None, control_hz: float, limits: ChunkLimits
) -> np.ndarray:
    """The chunk as float64 rows at the control rate; ChunkRefused naming the bound broken."""
    if rows.ndim != 2 or rows.shape[0] < 1 or rows.shape[1] < 1:
        raise ChunkRefused(f"actions of shape {list(rows.shape)}: need (H >= 1, D >= 1)")
    h, d = rows.shape
    if h > limits.max_rows:
        raise ChunkRefused(f"{h} rows, over policy.max_chunk_rows = {limits.max_rows}")
    if limits.dim and d != limits.dim:
        raise ChunkRefused(f"{d} columns, but this robot has {limits.dim} joints")
    hz = actions.hz if actions is not None else None
    if hz:
        n = ChunkLimits.resampled_rows(h, hz, control_hz)
        if n > limits.max_rows:
            raise ChunkRefused(
                f"{h} rows at {hz:g} Hz are {n} at the control rate, over "
                f"policy.max_chunk_rows = {limits.max_rows}"
            )
    rows = np.asarray(rows, dtype=np.float64)
    if not np.isfinite(rows).all():
        raise ChunkRefused("actions hold NaN or infinity")
    # Before resampling, so that the row named is the policy's own; interpolation keeps
    # every value within the rows' own range.
    limits.check_values(rows)
    return resample(rows, hz, control_hz) if hz else rows
