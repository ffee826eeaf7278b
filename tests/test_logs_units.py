"""The bookkeeping behind the walkthrough's log lines, on fake clocks: a camera's stale and
fresh transitions (robotd.runtime.events.StaleCameras) and when the lane's ticks were
(robotd.runtime.view.LaneClock). The real processes: tests/test_logs_camera_stale.py and
tests/test_logs_estop_stalled.py."""

from __future__ import annotations

import logging

import pytest

from robotd.lane.messages import Status, Step
from robotd.runtime.events import StaleCameras
from robotd.runtime.view import LaneClock


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _status(state: str = "RUNNING", stale: tuple[str, ...] = ()) -> Status:
    return Status(state, 1, "w", 0, "", None, 0, False, True, "", stale)


def _step(t_ns: int, top_ns: int | None) -> Step:
    cams = {"top": None if top_ns is None else (7, top_ns), "wrist": (3, t_ns)}
    return Step(1, "w", 0, t_ns, [0.0], [0.0], cams, top_ns is not None)


def test_stale_and_fresh_are_said_once_each_way(caplog) -> None:
    clock = Clock()
    cams = StaleCameras({"top": 200, "wrist": 200}, clock)
    with caplog.at_level(logging.INFO, logger="robotd"):
        for _ in range(3):
            cams.seen(_status(), _step(10**9, 10**9))
        for k in range(20):  # every Stats of a stall says top again: one line
            clock.now += 0.25
            cams.seen(_status(stale=("top",)), _step(2 * 10**9 + k, 10**9))
        clock.now += 0.25
        cams.seen(_status(), _step(8 * 10**9, 8 * 10**9))
        cams.seen(_status(), _step(8 * 10**9, 8 * 10**9))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "camera top is stale: its newest frame is 1000 ms old (max_age_ms 200): no act is "
        "asked, the robot holds until it is fresh again",
        "camera top is fresh again after 5.0 s stale: acts are asked again",
    ]


def test_a_camera_stale_as_the_episode_ends_is_not_called_fresh(caplog) -> None:
    clock = Clock()
    cams = StaleCameras({"top": 200}, clock)
    with caplog.at_level(logging.INFO, logger="robotd"):
        cams.seen(_status(stale=("top",)), _step(10**9, None))
        clock.now += 10.0
        cams.seen(_status("RESETTING"), None)  # starved: stale_cameras is only said RUNNING
        cams.seen(_status("RESETTING"), None)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("camera top is stale: it has delivered no frame"), lines
    assert lines[1:] == [
        "camera top was still stale (10.0 s) when the episode stopped running (RESETTING)"
    ]


def test_the_lane_clock_places_ticks_from_its_stats() -> None:
    clock = Clock()
    lane = LaneClock(30.0, clock)
    assert lane.ago(5) is None  # before any Stats: not said
    lane.stats(300, 10.0)  # received at 100.0: the lane's origin at 90.0 (or later)
    clock.now = 100.5
    lane.stats(315, 10.5)
    assert lane.ago(315) == pytest.approx(0.0)
    clock.now = 112.0  # a Stats read late (this process stopped) does not move the origin
    lane.stats(330, 11.0)
    assert lane.ago(330) == pytest.approx(11.0)  # taken at 101.0
    assert lane.ago(336) == pytest.approx(10.8)  # six ticks after it


def test_an_estop_before_the_policy_link_leaves_no_self_start_to_refuse() -> None:
    """A sim robot starts its first episode once the contract comes; an e-stop taken first
    (lane.sock, the main process stopped) keeps it in FAULT, and the self-start is not tried
    (it was, refused: a 'lane_error start needs IDLE' in the log)."""
    from robotd.config import load_config
    from robotd.control.kernel import Kernel

    out: list[object] = []
    k = Kernel(load_config(None, []), run_id="t", emit=out.append)
    k.command("estop", "before the link")
    k.set_contract(4)  # raised CommandRefused before
    assert k.machine.state == "FAULT" and k.machine.episode == 0
    k.command("clear_fault")
    k.set_contract(4)  # a new worker's contract later: still no self-start
    assert k.machine.state == "IDLE"


def test_a_flood_of_estops_is_logged_five_a_second_with_the_count_of_the_rest(caplog) -> None:
    from robotd.config import load_config
    from robotd.lane.messages import Event
    from robotd.repeats import Burst
    from robotd.runtime.events import PRESSES, EventLog
    from robotd.runtime.summary import RunSummary

    cfg = load_config(None, [])
    log = EventLog(cfg.control, RunSummary(cfg.control.hz), lambda _wep: None)
    clock = Clock()
    log._presses = Burst(PRESSES, 1.0, clock=clock)  # the same limiter, on a fake clock
    caplog.set_level(logging.INFO, "robotd")
    for i in range(100):  # a client's bug: a hundred e-stops within a millisecond
        log.on_event(Event("lane_estop", i, {"reason": f"press {i}"}))
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split("'")[-2] for line in lines] == [f"press {i}" for i in range(PRESSES)]
    clock.now += 1.0
    log.on_event(Event("lane_estop", 100, {"reason": "press 100"}))
    last = caplog.records[-1].getMessage()
    assert "press 100" in last and f"+{100 - PRESSES} more in the last 1 s" in last, last
    # a fault's first cause is never rate-limited, nor a repeating kind by this limiter
    log.on_event(Event("fault", 101, {"cause": "driver", "detail": "bus gone"}))
    assert "bus gone" in caplog.records[-1].getMessage()
