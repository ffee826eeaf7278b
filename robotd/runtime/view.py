"""A narrow, read-only view of the running daemon, for the operator server, telemetry and
the status line: the lane's state, the run's numbers, the policy link's state. Nothing in
it can change the daemon; commands go through `LaneCommands`.

The lane's state is a cache of what the control lane last said, so it is always served
with its age (`LaneSilence`): once the lane has been silent past a bound, every reader
says so instead of showing that last word as live."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from robotd.lane.messages import Reply, Status
from robotd.operator.words import lane_words
from robotd.runtime.summary import RunSummary

# How long the control lane may say nothing before the main process calls it silent. A
# healthy lane sends Stats every control.stats_interval_s (0.25 s) from every tick that is
# a multiple of its stats period, and a Step every tick while it runs; 8 stats periods is
# far beyond any scheduling hiccup of a healthy lane on a loaded 2-core machine (a false
# alarm would make `robotctl status` fail), yet short enough that nobody acts on stale
# numbers: the same 2 s after which `robotctl watch` calls the daemon's telemetry stale.
SILENT_MIN_S = 2.0
SILENT_STATS_PERIODS = 8
SILENT_TICKS = 10  # at a slow control rate: never under 10 control periods


def silent_after_s(hz: float, stats_interval_s: float) -> float:
    """The silence bound for a lane ticking at `hz` with stats every `stats_interval_s`."""
    stats_period_s = max(1, round(stats_interval_s * hz)) / hz  # control/process.py's rounding
    return max(SILENT_MIN_S, SILENT_STATS_PERIODS * stats_period_s, SILENT_TICKS / hz)


class LaneSilence:
    """When the control lane last spoke and whether it has been silent too long. Pure
    bookkeeping: time comes from `clock` (a fake one in tests). `pending` says that its
    messages wait unread on our side: then it did speak, the main process is what was slow,
    and that is never called a silence of the lane."""

    def __init__(self, after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s = after_s
        self.clock = clock
        self.last: float | None = None  # when it last spoke (None: not yet)
        self.declared = False  # a silence was declared (logged) and has not ended

    def heard(self) -> float | None:
        """The lane spoke: how long the declared silence it ends lasted, else None."""
        now = self.clock()
        ended = now - self.last if self.declared and self.last is not None else None
        self.last, self.declared = now, False
        return ended

    def age(self) -> float | None:
        """Seconds since the lane last spoke (None before it first did)."""
        return None if self.last is None else max(0.0, self.clock() - self.last)

    def silent(self, pending: bool = False) -> bool:
        return self._over(self.age(), pending)

    def _over(self, age: float | None, pending: bool) -> bool:
        return age is not None and age > self.after_s and not pending

    def declare(self, pending: bool = False) -> float | None:
        """The silence's age, once, when the lane has just become silent; else None."""
        if self.declared or not self.silent(pending):
            return None
        self.declared = True
        return self.age()

    def reading(self, pending: bool = False) -> dict[str, Any]:
        """The lane's age as plain data for status and telemetry ({} before it spoke)."""
        age = self.age()
        if age is None:
            return {}
        served = round(age, 3)
        return {
            "lane_age_s": served,
            "lane_silent": self._over(served, pending),  # judged on the age served, rounded
            "lane_silent_after_s": self.after_s,
        }


# A lane event read this much after the lane took it was not read as it came: the main
# process did not run (stopped, or starved of CPU). Under it, a loaded 2-core machine's
# scheduling and a batch's queueing; over it, worth saying when the event really happened.
LATE_EVENT_S = 2.0


class LaneClock:
    """When the control lane's ticks happened, on this process's monotonic clock (the lane
    stamps its events with its tick count, not a time). Each Stats says its tick count and
    the seconds since the lane's ticker origin; CLOCK_MONOTONIC is the system's, so the
    origin is our receipt time minus that, over-estimated by the delivery delay only: the
    least estimate is kept. A tick after the last Stats is placed at one period a tick
    from it (missed deadlines between make that a little early, never by seconds)."""

    def __init__(self, hz: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.period_s = 1.0 / hz
        self.clock = clock
        self._origin: float | None = None  # the lane's ticker origin, on our clock
        self._anchor = (0, 0.0)  # (tick count, seconds since the origin) of the last Stats

    def stats(self, ticks: int, elapsed_s: float) -> None:
        """A Stats message arrived now: the lane was at `ticks`, `elapsed_s` from its origin."""
        origin = self.clock() - elapsed_s
        self._origin = origin if self._origin is None else min(self._origin, origin)
        self._anchor = (ticks, elapsed_s)

    def ago(self, tick: int) -> float | None:
        """Seconds since the lane was at `tick` (None before its first Stats)."""
        if self._origin is None:
            return None
        ticks, elapsed_s = self._anchor
        at = self._origin + elapsed_s + (tick - ticks) * self.period_s
        return max(0.0, self.clock() - at)


class LaneCommands(Protocol):
    """How operator commands reach the control lane (robotd.runtime.bridge.LaneBridge)."""

    async def command(
        self,
        cmd: str,
        *,
        reason: str = "",
        task: str = "",
        timeout_s: float = 5.0,
        sent_ns: int | None = None,
    ) -> Reply: ...


def status_dict(status: Status | None) -> dict[str, Any]:
    """A lane Status as plain data (empty for None)."""
    if status is None:
        return {}
    out = msgspec.structs.asdict(status)
    if status.fault is not None:
        out["fault"] = msgspec.structs.asdict(status.fault)
    return out


class OperatorPolicy(Protocol):
    """What operators need of the policy session: its inference parameters read and set,
    and whether it answers acts now."""

    async def params(self, changes: dict[str, Any] | None) -> dict[str, Any]: ...

    def not_ready(self) -> str:
        """Why acts wait now though the link is up, in words; "" when they do not."""
        ...


@dataclass(frozen=True)
class DaemonView:
    """What operators may read: `state()` the lane's latest status as a plain dict (empty
    before the lane first spoke), `summary` the run's numbers, `link()` the policy link's
    state in a few words, `robot_state()` the joints as the last step left them."""

    run_id: str
    robot: str
    summary: RunSummary
    _status: Callable[[], Status | None]
    _link: Callable[[], dict[str, Any]]
    _robot: Callable[[], dict[str, Any]] = field(default=dict)
    _lane: Callable[[], dict[str, Any]] = field(default=dict)  # LaneBridge.lane_age
    _trace: Callable[[], dict[str, Any] | None] = field(default=lambda: None)  # store.health

    def state(self) -> dict[str, Any]:
        out = status_dict(self._status())
        if out:  # the age belongs to a state the lane reported
            out.update(self.lane())
        return out

    def lane(self) -> dict[str, Any]:
        """{"lane_age_s", "lane_silent", "lane_silent_after_s"}, and when silent "lane": the
        silence in words with the lane's last state ({} before the lane first spoke)."""
        out = self._lane()
        if out.get("lane_silent") is True:
            words = lane_words({**status_dict(self._status()), **out})
            out = {"lane": words, **out}  # first: robotctl stats prints it on top
        return out

    def link(self) -> dict[str, Any]:
        return self._link()

    def trace(self) -> dict[str, Any] | None:
        """Whether the trace reaches the disk (TraceStore.health); None: no trace on disk."""
        return self._trace()

    def robot_state(self) -> dict[str, Any]:
        """{"pos", "target", "queue"}: joint positions read and targets written at the last
        step (None before the first), and the rows queued."""
        return self._robot()
