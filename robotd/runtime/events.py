"""What the control lane's events mean in the main process: a log line at the right level,
the end of a worker-side episode passed on, and the one-time refill warning."""

from __future__ import annotations

import logging
from collections.abc import Callable

from robotd.config import ControlConfig
from robotd.lane.messages import Event, Merged
from robotd.repeats import Repeats
from robotd.runtime.summary import RunSummary

log = logging.getLogger("robotd")

WARNINGS = frozenset(
    {
        "fault",
        "driver_error",
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
    ) -> None:
        self.control = control
        self.summary = summary
        self.episode_ended = episode_ended
        self._refill_warned = False
        self._quiet = Repeats(QUIET_S)
        self._chunk_rows = 0  # rows of the last chunk merged (at the control rate)

    def on_event(self, ev: Event) -> None:
        level = logging.WARNING if ev.name in WARNINGS else logging.INFO
        key = _repeat_key(ev)
        if key is not None:
            said = self._quiet.say(key)
            if said is not None:
                extra = f" (+{said.unsaid} more in the last {said.since_s:.0f} s)"
                log.log(level, "%s %s%s", ev.name, ev.detail, extra if said.unsaid else "")
        else:
            log.log(level, "%s %s", ev.name, ev.detail)
        if ev.name == "episode_end":
            self.episode_ended(str(ev.detail.get("wep", "")))

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
