"""What the control lane's events mean in the main process: a log line at the right level
(saying when the lane took it, if that was well before this process read it), the end of a
worker-side episode passed on, the one-time refill warning, and a line each time a camera
goes stale and fresh again (StaleCameras)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from robotd.config import ControlConfig
from robotd.lane.messages import Event, Merged, Status, Step
from robotd.repeats import Burst, Repeats
from robotd.runtime.summary import RunSummary
from robotd.runtime.view import LATE_EVENT_S, LaneClock

log = logging.getLogger("robotd")

WARNINGS = frozenset(
    {
        "fault",
        "driver_error",
        "driver_warning",
        "overrun",
        "bad_message",
        "lane_refused",
        "lane_error",
        "lane_estop",
        "loop_died",
        "act_failed",
        "bad_chunk",
        "kernel_error",
        "episode_reset",
    }
)


# Events that can come every few ticks while a cause lasts (a worker gone, a driver failing):
# the first is logged, then one line every QUIET_S with how many there were.
REPEATING = frozenset({"act_failed", "driver_error", "bad_chunk"})
QUIET_S = 10.0
# E-stops after the first: each is logged, but at most PRESSES a second (more than anyone
# presses), so a client's bug that floods lane.sock cannot flood the log too.
PRESSES = 5


def _estop_again(ev: Event) -> bool:
    """A lane.sock e-stop, or an e-stop that found FAULT already latched."""
    later = ev.name == "fault" and "after" in ev.detail and ev.detail.get("cause") == "estop"
    return later or ev.name == "lane_estop"


def _repeat_key(ev: Event) -> str | None:
    """The kind a repeating event is counted under, None for one logged every time. A fault's
    first cause is always logged, and so is every later e-stop (each one someone pressed);
    a later cause the lane latches by itself again and again (a flaky bus: a driver fault,
    a good read, a driver fault...) is the same trouble going on, logged like driver_error."""
    if ev.name in REPEATING:
        return ev.name
    detail = ev.detail
    if ev.name == "fault" and "after" in detail and detail.get("cause") != "estop":
        return f"fault:{detail.get('cause')}"
    return None


class EventLog:
    """Logs each event (warnings for trouble, info for the rest; a repeating kind at most
    every QUIET_S, with its count) and acts on the few that concern the main process."""

    def __init__(
        self,
        control: ControlConfig,
        summary: RunSummary,
        episode_ended: Callable[[str], None],
        lane_clock: LaneClock | None = None,
    ) -> None:
        self.control = control
        self.summary = summary
        self.episode_ended = episode_ended
        self.lane_clock = lane_clock  # when the lane took an event (None: not said)
        self._refill_warned = False
        self._quiet = Repeats(QUIET_S)
        self._presses = Burst(PRESSES, 1.0)
        self._chunk_rows = 0  # rows of the last chunk merged (at the control rate)

    def on_event(self, ev: Event) -> None:
        level = logging.WARNING if ev.name in WARNINGS else logging.INFO
        key = _repeat_key(ev)
        if key is not None or _estop_again(ev):
            said = self._quiet.say(key) if key is not None else self._presses.say()
            if said is not None:
                log.log(level, "%s %s%s%s", ev.name, ev.detail, said.tail, self._late(ev))
        else:
            log.log(level, "%s %s%s", ev.name, ev.detail, self._late(ev))
        if ev.name == "episode_end":
            self.episode_ended(str(ev.detail.get("wep", "")))

    def _late(self, ev: Event) -> str:
        """The tail "(taken by the control lane N s earlier, ...)" when this process reads
        `ev` well after the lane took it: the line's own time is then not when it happened."""
        ago = self.lane_clock.ago(ev.tick) if self.lane_clock is not None else None
        if ago is None or ago < LATE_EVENT_S:
            return ""
        return (
            f" (taken by the control lane {ago:.1f} s earlier, while this process was not "
            "running)"
        )

    def on_merged(self, msg: Merged) -> None:
        self._chunk_rows = msg.rows

    def check_refill(self) -> None:
        """Realtime: say once when acts take longer than the rows left at the ask cover: with
        a fixed refill_steps, longer than it; with "auto" (which asks as early as the delay
        needs), longer than half a chunk, which then runs out before the next can come."""
        c = self.control
        if self._refill_warned or c.timing != "realtime":
            return
        lat = self.summary.ask_latency()
        if lat["count"] < 5:
            return
        steps, rows = lat["steps"]["p50"], self._chunk_rows
        if c.refill_steps == "auto":
            if rows and 2 * steps > rows:
                self._refill_warned = True
                log.warning(
                    "acts take %d steps (p50, %.0f ms) but a chunk holds %d rows at the control "
                    "rate: one act is in flight at a time, so the queue runs dry before every "
                    "chunk and the robot holds; have the policy answer at least %d rows (or "
                    "answer faster)",
                    steps,
                    lat["ms"]["p50"],
                    rows,
                    2 * steps,
                )
        elif steps > c.refill_steps:
            self._refill_warned = True
            log.warning(
                "acts take %d steps (p50, %.0f ms) but control.refill_steps is %d: the queue "
                "runs dry before every chunk and the robot holds; raise refill_steps to at "
                "least %d (and keep the policy's horizon above it)",
                lat["steps"]["p50"],
                lat["ms"]["p50"],
                c.refill_steps,
                lat["steps"]["p50"] + 1,
            )


class StaleCameras:
    """One warning when a camera's newest frame goes stale (missing, or older than its
    max_age_ms) while an episode runs, and one line when it is fresh again: once per
    transition, never per tick. Fed the lane's Status of each Stats (its `stale_cameras`:
    at the last step) and the last Step (its frames' capture times: how old the newest
    was). Both ends are warnings, as the lane's silence: `journalctl -p warning` shows the
    robot holding and why, and when that ended."""

    def __init__(
        self, max_age_ms: Mapping[str, float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_age_ms = dict(max_age_ms)
        self.clock = clock
        self.since: dict[str, float] = {}  # stale cameras, and since when (our clock)

    def seen(self, status: Status, step: Step | None) -> None:
        """The lane's state at a Stats; `step` the last Step read before it (None: none)."""
        running = status.state == "RUNNING"
        stale = set(status.stale_cameras) if running else set()
        now = self.clock()
        for name in sorted(stale - self.since.keys()):
            self.since[name] = now
            log.warning(
                "camera %s is stale: %s (max_age_ms %g): no act is asked, the robot holds "
                "until it is fresh again", name, _newest(step, name), self.max_age_ms.get(name, 0)
            )
        for name in sorted(self.since.keys() - stale):
            took = now - self.since.pop(name)
            if running:
                log.warning(
                    "camera %s is fresh again after %.1f s stale: acts are asked again", name, took
                )
            else:  # not known fresh: only no longer watched
                log.warning(
                    "camera %s was still stale (%.1f s) when the episode stopped running (%s)",
                    name, took, status.state,
                )


def _newest(step: Step | None, name: str) -> str:
    """How old camera `name`'s newest frame was at `step`, in words."""
    ref = step.cams.get(name) if step is not None else None
    if step is None or name not in step.cams:
        return "its newest frame's age is unknown"
    if ref is None:
        return "it has delivered no frame"
    return f"its newest frame is {(step.t - ref[1]) / 1e6:.0f} ms old"
