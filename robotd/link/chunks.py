"""A policy's answer made fit for the control lane, on the async lane: bounded, finite,
shaped for this robot and at the control rate.

Nothing a worker sends can make the control lane decode more than one bounded chunk in a
tick: every chunk is checked here, before it goes down, against `ChunkLimits` (rows,
columns, and the length after resampling to the control rate), and refused whole with a
reason otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from robotd.contract import Actions

MIN_ACTIONS_HZ = 0.1  # rows slower than this, or faster than MAX_ACTIONS_HZ, are refused
MAX_ACTIONS_HZ = 10_000.0


class ChunkRefused(ValueError):
    """A chunk the robot will not play; the message says why."""


@dataclass(frozen=True)
class ChunkLimits:
    """What one chunk may hold: rows (as answered and at the control rate) and columns."""

    max_rows: int = 1024
    dim: int = 0  # the robot's joints; 0 = not checked here

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
        rows = resample(rows.astype(np.float64, copy=False), hz, control_hz)
    rows = np.asarray(rows, dtype=np.float64)
    if not np.isfinite(rows).all():
        raise ChunkRefused("actions hold NaN or infinity")
    return rows
