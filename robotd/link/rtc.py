"""Real-time chunking on the async lane: the control lane's `Rtc` (robotd.lane.messages) made
into the act's `rtc` field, in the policy's own time base.

The lane gives the predicted delay `d` and the rows at the control rate: `prefix`, the rows
that will play at steps s … s+d−1 while the act computes (frozen), and `rest`, the queued
rows after them. A policy whose rows play at another rate (`actions.hz`) is given them
resampled to that rate, and `d` in its own rows (rounded up): row j of its answer is meant
for time j / hz after step s, like every row it answers.

The act's field (docs/protocol.md): ``{"delay": int >= 1, "prefix": (p x D) float64,
"rest": (r x D) float64}``, p <= delay, both arrays always present (0 rows when there are
none).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from robotd.contract import MAX_RTC_ROWS, Actions
from robotd.lane.messages import Rows, Rtc
from robotd.link.chunks import ChunkLimits, rows_at


class RtcRefused(ValueError):
    """The lane's rtc fields do not fit this robot; the message says why."""


def _rows(rows: Rows | None, dim: int, what: str) -> np.ndarray:
    if rows is None:
        return np.zeros((0, dim))
    try:
        arr = rows.array()
    except ValueError as exc:
        raise RtcRefused(f"rtc.{what}: {exc}") from None
    if arr.shape[1] != dim:
        raise RtcRefused(f"rtc.{what}: rows of {arr.shape[1]} values, this robot has {dim}")
    return arr


def _dim(rtc: Rtc, dim: int) -> int:
    """The robot's joints; 0 (not known here) takes the rows' own width."""
    if dim:
        return dim
    given = [r.dim for r in (rtc.prefix, rtc.rest) if r is not None]
    return given[0] if given else 0


def _at_policy_rate(
    prefix: np.ndarray, rest: np.ndarray, control_hz: float, hz: float
) -> tuple[np.ndarray, np.ndarray]:
    """Prefix and rest as rows at the policy's rate: row j is for time j / hz after step s.
    A frozen row (its time within the prefix's steps, [0, p / control_hz)) is taken from the
    prefix alone, holding its last row after the last step, since that row is what plays
    until the next step; the rest is not promised, so its rows interpolate from the
    prefix's last row on."""
    frozen = math.ceil(prefix.shape[0] * hz / control_hz - 1e-9)
    both = np.concatenate([prefix, rest])
    total = ChunkLimits.resampled_rows(both.shape[0], control_hz, hz)
    times = np.arange(max(frozen, total)) / hz
    return rows_at(prefix, control_hz, times[:frozen]), rows_at(both, control_hz, times[frozen:])


def rtc_request(
    rtc: Rtc | None, actions: Actions | None, control_hz: float, dim: int
) -> dict[str, Any] | None:
    """The act's rtc field (module doc), or None for an act without one. RtcRefused when the
    rows are not this robot's (`dim` joints; 0: not checked) or the prefix is longer than
    the delay."""
    if rtc is None:
        return None
    dim = _dim(rtc, dim)
    prefix, rest = _rows(rtc.prefix, dim, "prefix"), _rows(rtc.rest, dim, "rest")
    if prefix.shape[0] > rtc.delay:
        raise RtcRefused(f"rtc.prefix: {prefix.shape[0]} rows for a delay of {rtc.delay}")
    hz = actions.hz if actions is not None else None
    delay = rtc.delay
    if hz and abs(hz - control_hz) > 1e-9:
        prefix, rest = _at_policy_rate(prefix, rest, control_hz, hz)
        delay = max(1, math.ceil(rtc.delay * hz / control_hz - 1e-9))
    # A policy faster than the control loop sees more rows than the lane sent: bounded as
    # the worker bounds them (the robot keeps its frozen rows whatever the policy is told).
    delay = min(delay, MAX_RTC_ROWS)
    prefix, rest = prefix[:delay], rest[:MAX_RTC_ROWS]
    return {
        "delay": int(delay),
        "prefix": np.ascontiguousarray(prefix, dtype=np.float64),
        "rest": np.ascontiguousarray(rest, dtype=np.float64),
    }
