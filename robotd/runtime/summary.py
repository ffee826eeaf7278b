"""What a run did, in numbers: gathered from the lanes' messages, written at exit."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from robotd.control.counters import AskLatency
from robotd.control.histogram import LatencyHistogram
from robotd.lane.messages import Stats, Step
from robotd.link.reservoir import Reservoir
from robotd.link.steps import UPLOAD_COUNTERS, LinkCounters

_EMPTY = {"p50": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0}


# The control lane's counters the run's summary and every telemetry message both carry (the
# summary has more; telemetry adds `ticks`).
LANE_COUNTERS = (
    "missed_ticks",
    "acts",
    "chunks",
    "holds",
    "max_consecutive_holds",
    "starved_episodes",
    "stale_chunks",
    "rows_dropped",
    "stale_rows_played",
    "delay_overruns",
    "episode_resets",
    "interventions",
    "clipped",
    "clamped",
    "rejected",
    "invalid_observations",
)


class RunSummary:
    """Accumulates the control lane's cumulative stats and reads the link's counters."""

    def __init__(self, hz: float) -> None:
        self.hz_target = hz
        self.started = time.monotonic()
        self.last: Stats | None = None
        self.totals: dict[str, int] = {}
        self.tracking = Reservoir()
        # from each episode's first played row on: the first chunk's wait (the arm held away
        # from the target, as long as the policy takes to answer) says nothing of tracking
        self.tracking_played = Reservoir()
        self._episode: tuple[int, str] | None = None  # the episode a row has played in
        self.link: LinkCounters | None = None  # the policy link's, read live
        self.session: Any = None  # the policy session (its health, replies dropped)
        self.verdicts: list[dict[str, Any]] = []
        self._lateness: dict[str, dict[str, float]] = {}
        self._ask = AskLatency()

    def on_stats(self, msg: Stats) -> None:
        """The lane's stats: its histograms become percentiles here, not in the lane."""
        self.last = msg
        self.totals = msg.totals()
        self._lateness = {
            "lateness": LatencyHistogram.from_data(msg.lateness).summary(),
            "wake_lateness": LatencyHistogram.from_data(msg.wake_lateness).summary(),
        }
        ask = AskLatency()
        ask.steps = dict(msg.ask_steps)
        ask.ns = LatencyHistogram.from_data(msg.ask_ns)
        self._ask = ask

    def on_step(self, msg: Step) -> None:
        key = (msg.ep, msg.wep)
        if msg.target is not None and not msg.held:
            self._episode = key
        gt = msg.gt
        if gt and "tracking_error" in gt:
            error = float(gt["tracking_error"])
            self.tracking.add(error)
            if self._episode == key:
                self.tracking_played.add(error)

    def uploads(self) -> dict[str, int]:
        """uploaded_frames, uploaded_bytes, inline_frames, skipped_frames, refused_frames
        (zeros before the policy link is up)."""
        live = self.link.uploads() if self.link is not None else {}
        return {k: int(live.get(k, 0)) for k in UPLOAD_COUNTERS}

    def ask_latency(self) -> dict[str, Any]:
        """Ask → chunk latency p50/p99 in steps and ms."""
        return self._ask.summary()

    def lateness(self, which: str = "lateness") -> dict[str, float]:
        """µs percentiles of the lane's tick lateness: at the deadline (`lateness`, after the
        spin tail) or of the sleep's wake-up before the spin (`wake_lateness`)."""
        return self._lateness.get(which, _EMPTY)

    def measured_hz(self) -> float:
        ticks = self.totals.get("ticks", 0)
        elapsed = self.last.elapsed_s if self.last is not None else 0.0
        return ticks / elapsed if ticks and elapsed > 0 else 0.0

    def count(self, name: str) -> int:
        return self.totals.get(name, 0)

    def act_rtt_ms(self) -> dict[str, float]:
        rtt = self.link.rtt_ms if self.link is not None else Reservoir()
        return {"p50": rtt.percentile(50), "p99": rtt.percentile(99)}

    def infer_ms(self) -> dict[str, float]:
        """The policy's own time, as the worker (or openpi server) reports it."""
        inf = self.link.infer_ms if self.link is not None else Reservoir()
        return {"p50": inf.percentile(50), "p99": inf.percentile(99)}

    def link_counts(self) -> dict[str, Any]:
        """reconnects, the replies dropped (late, late pings, unknown, duplicate, undecodable),
        unknown_acks, worker_gone_s."""
        if self.session is None:
            return {"reconnects": 0, **_replies({}), "unknown_acks": 0, "worker_gone_s": 0.0}
        health = self.session.health.as_dict()
        return {
            "reconnects": health["reconnects"],
            **_replies(self.session.reply_counts()),
            "unknown_acks": self.link.unknown_acks if self.link is not None else 0,
            "worker_gone_s": health["worker_gone_s"],
        }

    def to_dict(self) -> dict[str, Any]:
        t = self.totals
        names = ("overruns", "episodes", "act_failures", *LANE_COUNTERS, "dropped_messages",
                 "bad_messages")  # fmt: skip
        return {
            "ticks": t.get("ticks", 0),
            "hz": round(self.measured_hz(), 3),
            "hz_target": self.hz_target,
            "lateness_us": self.lateness(),
            "wake_lateness_us": self.lateness("wake_lateness"),
            **{name: t.get(name, 0) for name in names},
            "ask_latency": self.ask_latency(),
            "tracking_error": {
                "mean": self.tracking.mean(),
                "p95": self.tracking.percentile(95),
                "played_mean": self.tracking_played.mean(),
            },
            "act_rtt_ms": self.act_rtt_ms(),
            "infer_ms": self.infer_ms(),
            **self.link_counts(),
            "act_errors": self.link.act_errors if self.link is not None else 0,
            **self.uploads(),
            "driver": self.last.driver if self.last is not None else {},
            "verdicts": self.verdicts,
            "state": self.last.state.state if self.last is not None else "",
        }

    def line(self) -> str:
        """The run in one log line, for the operator who stopped it (the JSON has the rest)."""
        t, link = self.totals, self.link_counts()
        failed = t.get("act_failures", 0)
        return (
            f"run ended after {time.monotonic() - self.started:.1f} s: {t.get('ticks', 0)} "
            f"ticks at {self.measured_hz():.2f} Hz (target {self.hz_target:g}), lateness p99 "
            f"{self.lateness()['p99']:.1f} µs, {t.get('overruns', 0)} overruns; "
            f"{t.get('episodes', 0)} episodes, {t.get('chunks', 0)} chunks from "
            f"{t.get('acts', 0)} acts ({failed} failed), {t.get('holds', 0)} ticks held, "
            f"{t.get('interventions', 0)} shield interventions ({t.get('clipped', 0)} clipped, "
            f"{t.get('clamped', 0)} clamped, {t.get('rejected', 0)} rejected), "
            f"{t.get('episode_resets', 0)} episode resets, {link['reconnects']} reconnects"
        )

    def write(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)


def _replies(dropped: dict[str, int]) -> dict[str, int]:
    """The summary's keys for the replies the act client dropped, by kind
    (robotd.link.dropped.DROPPED_KINDS; late_replies_dropped's name is older than the rest)."""
    return {
        "late_replies_dropped": dropped.get("late", 0),
        "late_pings": dropped.get("late_ping", 0),
        "unknown_replies": dropped.get("unknown", 0),
        "duplicate_replies": dropped.get("duplicate", 0),
        "undecodable_replies": dropped.get("undecodable", 0),
    }
