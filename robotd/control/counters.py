"""What the control lane counts: per-run counters, the queue's and the shield's, and the
ask → chunk latency. The counter structs travel as they are in the lane's Stats message
(robotd.lane.messages), so building that message costs no per-field work."""

from __future__ import annotations

from typing import Any

import msgspec

from robotd.control.histogram import LatencyHistogram


class Counters(msgspec.Struct, forbid_unknown_fields=True):
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
    max_holds_after_reset: int = 0  # ticks held between a reset and the new episode's first row
    invalid_observations: int = 0
    driver_errors: int = 0
    bad_chunks: int = 0
    bad_messages: int = 0  # lane messages refused as malformed
    skipped_steps: int = 0  # steps whose tick an overrun skipped (nothing read, nothing played)
    stale_rows_played: int = 0  # realtime: rows played after the step they were meant for
    delay_overruns: int = 0  # realtime: answers later than the delay their act predicted


class QueueCounters(msgspec.Struct, forbid_unknown_fields=True):
    """Cumulative counts since the queue was made (flush does not clear them)."""

    chunks: int = 0  # chunks handed to merge (stale ones included)
    stale_chunks: int = 0  # chunks with no row to merge (all past, or past and frozen)
    rows_dropped: int = 0  # queued rows whose step passed before they were played
    flushed_rows: int = 0  # rows discarded by flush
    merge_dropped: int = 0  # chunk rows dropped at merge as already past (MergeResult.dropped)
    replaced_rows: int = 0  # queued rows for future steps superseded by a newer chunk


class ShieldCounters(msgspec.Struct, forbid_unknown_fields=True):
    clipped: int = 0
    clamped: int = 0
    rejected: int = 0
    per_joint: dict[str, int] = {}  # rate-limit clamps by joint

    @property
    def interventions(self) -> int:
        return self.clipped + self.clamped + self.rejected


class AskLatency:
    """Ask → merge latency of every merged chunk, in control steps (exact counts) and in
    ns of the tick clock (a LatencyHistogram); `summary()` gives p50/p99 of each."""

    def __init__(self) -> None:
        self.steps: dict[int, int] = {}
        self.ns = LatencyHistogram()

    def add(self, steps: int, ns: int) -> None:
        self.steps[steps] = self.steps.get(steps, 0) + 1
        self.ns.add(ns)

    def steps_percentile(self, q: float) -> int:
        rank, seen = max(1, -(-self.ns.count * q // 100)), 0  # nearest rank
        for value in sorted(self.steps):
            seen += self.steps[value]
            if seen >= rank:
                return value
        return 0

    def summary(self) -> dict[str, Any]:
        """{"count", "steps": {"p50", "p99"}, "ms": {"p50", "p99"}}; zeros when empty."""
        return {
            "count": self.ns.count,
            "steps": {"p50": self.steps_percentile(50), "p99": self.steps_percentile(99)},
            "ms": {"p50": self.ns.percentile(50) / 1e3, "p99": self.ns.percentile(99) / 1e3},
        }
