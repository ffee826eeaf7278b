"""Retry delays that double after each failure in a row, up to a cap, and start again
from the first once things went well: something that fails at once every time (a bad
device, a crash on import) is retried ever more rarely, not every second forever.

Shared by the supervisor's restarts (robotd.runtime.supervisor) and the worker's copies
that could not start (robotd.worker.copies). Pure and clock-free: callers decide what
"went well" means (a copy ready; a child up long enough) and call `reset`.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_S = 1.0
MAX_S = 30.0


@dataclass
class Backoff:
    """`next()` the delay before the next attempt: `first_s`, doubling to `max_s`."""

    first_s: float = FIRST_S
    max_s: float = MAX_S
    delay_s: float = 0.0  # the last delay handed out (0: no failure in a row)
    in_a_row: int = 0  # failures since the last reset

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            got = f"{self.first_s}, {self.max_s}"
            raise ValueError(f"backoff: need 0 < first_s <= max_s, got {got}")

    def next(self) -> float:
        self.delay_s = min(self.max_s, max(self.first_s, 2 * self.delay_s))
        self.in_a_row += 1
        return self.delay_s

    def reset(self) -> None:
        self.delay_s = 0.0
        self.in_a_row = 0


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st…"""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
