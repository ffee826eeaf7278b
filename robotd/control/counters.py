"""What the control lane counts: per-run counters and the ask → chunk latency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from robotd.control.histogram import LatencyHistogram


@dataclass(slots=True)
class Counters:
    ticks: int = 0
    steps: int = 0
    episodes: int = 0
    acts: int = 0
    act_failures: int = 0
    chunks: int = 0
    late_chunks: int = 0  # answers to an ask no longer in flight (episode changed)
    holds: int = 0
    max_consecutive_holds: int = 0
    starved_episodes: int = 0
    episode_resets: int = 0
    invalid_observations: int = 0
    driver_errors: int = 0
    bad_chunks: int = 0
    skipped_steps: int = 0  # steps whose tick an overrun skipped (nothing read, nothing played)
    stale_rows_played: int = 0  # realtime: rows played after the step they were meant for


class AskLatency:
    """Ask → merge latency of every merged chunk, in control steps (exact counts) and in
    ns of the tick clock (a LatencyHistogram); `summary()` gives p50/p99 of each."""

    def __init__(self) -> None:
        self.steps: dict[int, int] = {}
        self.ns = LatencyHistogram()

    def add(self, steps: int, ns: int) -> None:
        self.steps[steps] = self.steps.get(steps, 0) + 1
        self.ns.add(ns)

    def _steps_percentile(self, q: float) -> int:
        rank, seen = max(1, -(-self.ns.count * q // 100)), 0  # nearest rank
        for value in sorted(self.steps):
            seen += self.steps[value]
            if seen >= rank:
                return value
        return 0

    def to_wire(self) -> dict[str, Any]:
        """Plain data for the lane's stats message: cheap to build; the main process
        computes the percentiles (`from_wire(...).summary()`), not the control lane."""
        return {"steps": [[k, n] for k, n in self.steps.items()], "ns": self.ns.to_wire()}

    @classmethod
    def from_wire(cls, data: Any) -> AskLatency:
        out = cls()
        if not data:
            return out
        out.steps = {int(k): int(n) for k, n in data["steps"]}
        out.ns = LatencyHistogram.from_wire(data["ns"])
        return out

    def summary(self) -> dict[str, Any]:
        """{"count", "steps": {"p50", "p99"}, "ms": {"p50", "p99"}}; zeros when empty."""
        return {
            "count": self.ns.count,
            "steps": {"p50": self._steps_percentile(50), "p99": self._steps_percentile(99)},
            "ms": {"p50": self.ns.percentile(50) / 1e3, "p99": self.ns.percentile(99) / 1e3},
        }
