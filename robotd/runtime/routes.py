"""What the main process does with each kind of message the control lane sends: the
dispatch table the bridge calls (each kind also goes to the trace, after its handler)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio

from robotd.lane.messages import Ask, Bye, Event, Merged, Ready, StartState, Stats, Step
from robotd.runtime import sdnotify
from robotd.runtime.bridge import LaneBridge
from robotd.runtime.events import EventLog
from robotd.runtime.recorder import Recorder, tee
from robotd.runtime.summary import RunSummary

log = logging.getLogger("robotd")


class Routes:
    """Owns the handlers; `session()` is the policy session once there is one."""

    def __init__(
        self,
        summary: RunSummary,
        events: EventLog,
        session: Callable[[], Any],
        recorder: Recorder | None,
    ) -> None:
        self.summary = summary
        self.events = events
        self.session = session
        self.recorder = recorder
        self.ready = anyio.Event()  # the lane ticks
        self.lane_done = anyio.Event()  # the lane said Bye after its last stats
        self.last_step: Step | None = None

    def install(self, b: LaneBridge) -> None:
        rec = self.recorder
        b.on(Step, tee(self._on_step, rec, Step))
        b.on(Ask, tee(self._on_ask, rec, Ask))
        b.on(Merged, tee(self._on_merged, rec, Merged))
        b.on(Stats, tee(self._on_stats, rec, Stats))
        b.on(Event, tee(self.events.on_event, rec, Event))
        b.on(Ready, self._on_ready)
        b.on(Bye, lambda m: self.lane_done.set())
        if rec is not None:
            b.on(StartState, rec.on_start_state)
            b.tap = rec.sent

    def _on_step(self, msg: Step) -> None:
        self.last_step = msg
        self.summary.on_step(msg)
        if (s := self.session()) is not None:
            s.on_step(msg)

    def _on_ask(self, msg: Ask) -> None:
        if (s := self.session()) is not None:
            s.on_ask(msg)

    def _on_merged(self, msg: Merged) -> None:
        self.events.on_merged(msg)
        if (s := self.session()) is not None:
            s.on_merged(msg)

    def _on_stats(self, msg: Stats) -> None:
        self.summary.on_stats(msg)
        sdnotify.tick_progress(msg.counters.ticks)
        self.events.check_refill()

    def _on_ready(self, msg: Ready) -> None:
        for warning in msg.warnings:
            log.warning("control lane: %s", warning)
        self.ready.set()

    def robot(self, queue: int | None) -> dict[str, object]:
        """The robot's latest joints and target, for telemetry (small, rounded)."""
        st = self.last_step
        return {
            "pos": None if st is None else [round(x, 5) for x in st.pos],
            "target": None if st is None or st.target is None else [round(x, 5) for x in st.target],
            "queue": queue,
        }
