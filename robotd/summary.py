"""What a run did, in numbers: gathered from the lanes' messages, written at exit."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robotd.control.counters import AskLatency
from robotd.control.histogram import LatencyHistogram
from robotd.link.session import UPLOAD_COUNTERS
from robotd.reservoir import Reservoir


class RunSummary:
    """Accumulates the control lane's cumulative stats and the link's counters."""

    def __init__(self, hz: float) -> None:
        self.hz_target = hz
        self.started = time.monotonic()
        self.stats: dict[str, Any] = {}
        self.tracking = Reservoir()
        self.link: dict[str, Any] = {}
        # the policy link's upload counters, read live (stats request, telemetry)
        self.link_counters: Callable[[], dict[str, int]] | None = None
        self.rtt = Reservoir()
        self.verdicts: list[dict[str, Any]] = []

    def on_stats(self, msg: dict[str, Any]) -> None:
        self.stats = msg

    def on_step(self, msg: dict[str, Any]) -> None:
        gt = msg.get("gt")
        if gt and "tracking_error" in gt:
            self.tracking.add(float(gt["tracking_error"]))

    def uploads(self) -> dict[str, int]:
        """uploaded_frames, uploaded_bytes, inline_frames, skipped_frames, refused_frames
        (zeros before the policy link is up)."""
        live = self.link_counters() if self.link_counters is not None else {}
        return {k: int(live.get(k, 0)) for k in UPLOAD_COUNTERS}

    def ask_latency(self) -> dict[str, Any]:
        """Ask → chunk latency p50/p99 in steps and ms (the lane ships the raw counts)."""
        return AskLatency.from_wire(self.stats.get("ask_latency")).summary()

    def lateness(self, which: str = "lateness") -> dict[str, float]:
        """µs percentiles of the lane's tick lateness: at the deadline (`lateness`, after the
        spin tail) or of the sleep's wake-up before the spin (`wake_lateness`)."""
        wire = self.stats.get(which)
        if not wire:
            return {"p50": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0}
        return LatencyHistogram.from_wire(wire).summary()

    def measured_hz(self) -> float:
        ticks = self.stats.get("ticks", 0)
        elapsed = self.stats.get("elapsed_s", 0.0)
        return ticks / elapsed if ticks and elapsed > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        s = self.stats
        return {
            "ticks": s.get("ticks", 0),
            "hz": round(self.measured_hz(), 3),
            "hz_target": self.hz_target,
            "lateness_us": self.lateness(),
            "wake_lateness_us": self.lateness("wake_lateness"),
            "missed_ticks": s.get("missed_ticks", 0),
            "overruns": s.get("overruns", 0),
            "episodes": s.get("episodes", 0),
            "acts": s.get("acts", 0),
            "act_failures": s.get("act_failures", 0),
            "chunks": s.get("chunks", 0),
            "holds": s.get("holds", 0),
            "max_consecutive_holds": s.get("max_consecutive_holds", 0),
            "starved_episodes": s.get("starved_episodes", 0),
            "stale_chunks": s.get("stale_chunks", 0),
            "rows_dropped": s.get("rows_dropped", 0),
            "stale_rows_played": s.get("stale_rows_played", 0),
            "ask_latency": self.ask_latency(),
            "episode_resets": s.get("episode_resets", 0),
            "interventions": s.get("interventions", 0),
            "invalid_observations": s.get("invalid_observations", 0),
            "dropped_messages": s.get("dropped_messages", 0),
            "tracking_error": {
                "mean": self.tracking.mean(),
                "p95": self.tracking.percentile(95),
            },
            "act_rtt_ms": {"p50": self.rtt.percentile(50), "p99": self.rtt.percentile(99)},
            **self.uploads(),
            **self.link,
            "verdicts": self.verdicts,
            "state": (s.get("state") or {}).get("state", ""),
        }

    def write(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)
