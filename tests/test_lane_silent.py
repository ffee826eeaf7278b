"""A silent control lane is never shown as live: the age logic on a fake clock, the words
and screens built from it, and the bridge's warning and recovery line on real ipc
sockets. (The daemon with a stopped control process: tests/test_lane_silent_e2e.py.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
import zmq
import zmq.asyncio
from rich.console import Console

from robotd.lane import codec
from robotd.lane.messages import Bye, Event, Ready, Status
from robotd.operator.robotctl import _lane_silent
from robotd.operator.status import format_status
from robotd.operator.view import Screen, render
from robotd.operator.words import lane_words, state_words
from robotd.runtime.bridge import LaneBridge
from robotd.runtime.summary import RunSummary
from robotd.runtime.view import SILENT_MIN_S, DaemonView, LaneSilence, silent_after_s

RUNNING = {"state": "RUNNING", "episode": 11, "step": 427, "queue": 14}


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nothing_is_said_before_the_lane_first_speaks() -> None:
    clock = FakeClock()
    s = LaneSilence(2.0, clock)
    clock.now += 60  # start-up is the READY timeout's business, not a silence
    assert s.age() is None and not s.silent() and s.declare() is None and s.reading() == {}


def test_a_silence_is_declared_once_past_the_bound_and_its_end_measured() -> None:
    clock = FakeClock()
    s = LaneSilence(2.0, clock)
    assert s.heard() is None
    clock.now += 2.0
    assert not s.silent() and s.declare() is None  # at the bound: still healthy
    assert s.reading() == {"lane_age_s": 2.0, "lane_silent": False, "lane_silent_after_s": 2.0}
    clock.now += 0.5
    assert s.silent() and s.declare() == 2.5
    clock.now += 10
    assert s.declare() is None  # one warning per silence
    assert s.reading()["lane_silent"] is True and s.reading()["lane_age_s"] == 12.5
    assert s.heard() == 12.5  # the silence it ends
    assert not s.silent() and s.heard() is None  # ended: nothing more to say
    clock.now += 3
    assert s.declare() == 3.0  # a second silence is a new one


def test_the_served_reading_agrees_with_itself_at_the_rounding_edge() -> None:
    # A bound of 64 / 30 s and an age a fraction of a millisecond past it: the age served
    # (rounded to 2.133) must not sit at or under the bound while the reading says silent.
    clock = FakeClock()
    s = LaneSilence(64 / 30, clock)
    s.heard()
    for extra in (0.0, 0.0001, 0.0004, 0.0005, 0.0006, 0.001, 0.01):
        clock.now = 100.0 + 64 / 30 + extra
        r = s.reading()
        assert r["lane_silent"] is (r["lane_age_s"] > r["lane_silent_after_s"]), (extra, r)


def test_unread_messages_are_not_a_silence_of_the_lane() -> None:
    clock = FakeClock()
    s = LaneSilence(2.0, clock)
    s.heard()
    clock.now += 5  # the main process was stopped; the lane's messages wait for it
    assert not s.silent(pending=True) and s.declare(pending=True) is None
    assert s.reading(pending=True)["lane_silent"] is False


def test_the_bound_beats_the_lanes_own_stats_period() -> None:
    # The sim and real configs: stats every round(7.5) = 8 ticks at 30 Hz, 8 of those.
    assert silent_after_s(30.0, 0.25) == pytest.approx(8 * 8 / 30)
    assert silent_after_s(100.0, 0.25) == SILENT_MIN_S == 2.0
    assert silent_after_s(1.0, 0.25) == 10.0  # 1 Hz: stats every tick, 10 ticks
    assert silent_after_s(100.0, 1.0) == 8.0  # slow stats: 8 of their periods
    for hz, every in ((30.0, 0.25), (7.0, 0.9), (500.0, 0.25), (2.0, 3.0)):
        stats_period = max(1, round(every * hz)) / hz
        assert silent_after_s(hz, every) >= 8 * stats_period and silent_after_s(hz, every) >= 2


def test_the_words_say_silent_with_the_last_state() -> None:
    silent = {**RUNNING, "lane_silent": True, "lane_age_s": 12.34}
    assert lane_words(silent) == "LANE SILENT 12.3 s (last: RUNNING episode 11 step 427)"
    assert state_words(silent) == lane_words(silent)
    assert lane_words({**RUNNING, "lane_silent": False, "lane_age_s": 0.1}) == ""
    assert state_words({**RUNNING, "lane_age_s": 0.1}) == "RUNNING episode 11 step 427"
    assert lane_words({"lane_silent": True, "lane_age_s": "x"}).startswith("LANE SILENT ? s")


def _view(reading: dict) -> DaemonView:
    st = Status("RUNNING", 11, "w", 427, "", None, 14, False, True)
    return DaemonView("run", "sim", RunSummary(30.0), lambda: st, dict, dict, lambda: reading)


def test_the_view_serves_the_state_with_its_age() -> None:
    live = _view({"lane_age_s": 0.05, "lane_silent": False, "lane_silent_after_s": 2.0})
    assert live.state()["lane_age_s"] == 0.05 and "lane" not in live.state()
    gone = _view({"lane_age_s": 12.3, "lane_silent": True, "lane_silent_after_s": 2.0})
    lane = gone.lane()
    assert next(iter(lane)) == "lane"  # first: `robotctl stats` prints it on top
    assert lane["lane"] == "LANE SILENT 12.3 s (last: RUNNING episode 11 step 427)"
    assert gone.state()["state"] == "RUNNING" and gone.state()["lane_silent"] is True
    assert _lane_silent("status", gone.state()) and _lane_silent("stats", lane)
    assert not _lane_silent("status", live.state()) and not _lane_silent("start", lane)


def test_the_status_line_heads_with_the_silence() -> None:
    silent = {**RUNNING, "lane_silent": True, "lane_age_s": 4.0}
    assert format_status({}, silent, 30.0, 100.0).startswith(
        "LANE SILENT 4.0 s (last: RUNNING episode 11 step 427) |"
    )
    assert format_status({}, RUNNING, 30.0, 100.0).startswith("RUNNING   ep 11 step    427 |")


def _screen_text(screen: Screen) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(render(screen))
    return console.export_text()


def test_watch_shows_a_stale_banner_for_a_silent_lane() -> None:
    msg = {"state": {**RUNNING, "lane_silent": True, "lane_age_s": 9.6}, "hz": 30.006}
    text = _screen_text(Screen("ipc://x", msg=msg, age_s=0.5))
    assert "STALE  control lane silent 10 s (last: RUNNING episode 11 step 427)" in text
    assert "last update" not in text  # the daemon's own telemetry is fresh
    live = {"state": {**RUNNING, "lane_silent": False, "lane_age_s": 0.02}, "hz": 30.0}
    assert "STALE" not in _screen_text(Screen("ipc://x", msg=live, age_s=0.1))
    older = {"state": RUNNING}  # a daemon that does not report the lane's age
    assert "STALE" not in _screen_text(Screen("ipc://x", msg=older, age_s=0.1))


class _Said(logging.Handler):
    """Sets an event when a record matching `text` is logged (on the event loop's thread)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []
        self.waiting: tuple[str, anyio.Event] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())
        if self.waiting is not None and self.waiting[0] in record.getMessage():
            self.waiting[1].set()

    async def wait(self, text: str, timeout: float = 20.0) -> str:
        if not any(text in r for r in self.records):
            self.waiting = (text, anyio.Event())
            with anyio.fail_after(timeout):
                await self.waiting[1].wait()
        return next(r for r in self.records if text in r)


@contextmanager
def _listening() -> Iterator[_Said]:
    """A _Said on the "robotd" logger for the block, taken off after whatever happened."""
    said = _Said()
    logger = logging.getLogger("robotd")
    logger.addHandler(said)
    try:
        yield said
    finally:
        logger.removeHandler(said)


@contextmanager
def _bridge_and_lane(
    tmp_path: Path, silent_after_s: float
) -> Iterator[tuple[LaneBridge, zmq.Socket]]:
    """A LaneBridge bound in `tmp_path`, calling the lane silent after `silent_after_s`, and
    a PUSH socket connected where the control lane's would be; both closed after the block.
    Entered in the async code that runs the bridge (its zmq.asyncio sockets belong to that
    loop); the caller starts bridge.run."""
    ctx = zmq.asyncio.Context()
    bridge = LaneBridge(ctx, tmp_path, silent_after_s=silent_after_s)
    bridge.bind()
    lane = zmq.Context.instance().socket(zmq.PUSH)
    lane.connect(bridge.up_ep)
    try:
        yield bridge, lane
    finally:
        lane.close(linger=0)
        bridge.close()
        ctx.term()


def test_the_bridge_warns_once_and_says_when_the_lane_speaks_again(tmp_path: Path) -> None:
    async def main(said: _Said) -> None:
        with _bridge_and_lane(tmp_path, 0.3) as (bridge, lane):
            async with anyio.create_task_group() as tg:
                tg.start_soon(bridge.run)
                lane.send(codec.encode_batch([Ready(4242, [])]))
                warning = await said.wait("control lane silent for")
                assert "pid 4242" in warning
                assert bridge.lane_age()["lane_silent"] is True
                lane.send(codec.encode_batch([Event("back", 1)]))
                back = await said.wait("control lane speaks again after")
                assert bridge.lane_age()["lane_silent"] is False
                tg.cancel_scope.cancel()
        assert float(back.split("after ")[1].split(" s")[0]) >= 0.3
        assert sum("control lane silent for" in r for r in said.records) == 1

    with _listening() as said:
        anyio.run(main, said)


def test_a_lane_that_said_bye_is_not_warned_about(tmp_path: Path) -> None:
    async def main() -> None:
        with _bridge_and_lane(tmp_path, 0.1) as (bridge, lane):
            got_bye = anyio.Event()
            bridge.on(Bye, lambda m: got_bye.set())
            async with anyio.create_task_group() as tg:
                tg.start_soon(bridge.run)
                lane.send(codec.encode_batch([Ready(1, []), Bye()]))
                with anyio.fail_after(20):
                    await got_bye.wait()
                await anyio.sleep(0.5)  # five bounds: the watch had every chance to warn
                tg.cancel_scope.cancel()

    with _listening() as said:
        anyio.run(main)
    assert not any("silent" in r for r in said.records), said.records
