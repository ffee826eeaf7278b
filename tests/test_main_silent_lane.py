"""The control lane on its own (a real ControlLane and its sockets, ticked by hand on a fake
clock; the test is the main process): a main process that beat and then went silent is
latched FAULT `main_silent` (held), e-stopped after orphan_s, and once heard again the
cause is gone but the latch stays until clear_fault. A lane never beaten to is not judged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from robotd.lane.messages import Beat, Command
from tests.lane_util import LaneRig, wait_in_socket

HZ = 30


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[LaneRig]:
    r = LaneRig(tmp_path, 'robot.start="idle"', "control.main_silent_s=1",
                "control.orphan_s=0.5", "safety.estop_category=0")
    yield r
    r.close()


def _ticks(rig: LaneRig, n: int) -> list[dict]:
    return [m for _ in range(n) for m in rig.tick()]


def _wait_beat(rig: LaneRig) -> None:
    """Send a Beat and tick until the lane took it (ipc delivers before long)."""
    rig.send(Beat())
    for _ in range(200):
        if rig.lane.main.heard_ns is not None and rig.lane.main.heard_ns >= rig.now:
            return
        rig.tick()
    raise AssertionError("the lane never took the Beat")


def test_silence_after_a_beat_latches_holds_estops_and_stays_latched(rig: LaneRig) -> None:
    _wait_beat(rig)
    rig.send(Command(1, "start"))
    wait_in_socket(rig.lane.ports.down)
    out = _ticks(rig, HZ // 2)
    assert rig.lane.kernel.status().state == "RUNNING", out
    out = _ticks(rig, HZ)  # 1.5 s since the beat: silent
    st = rig.lane.kernel.status()
    assert st.state == "FAULT" and st.fault.cause == "main_silent", st
    assert st.torque and not st.fault.estop  # held first, for orphan_s
    assert any(m.get("name") == "episode_end" and m.get("cause") == "main_silent" for m in out)
    _ticks(rig, HZ)  # past orphan_s: the e-stop
    st = rig.lane.kernel.status()
    assert st.fault.estop and st.fault.latest_cause == "estop" and not st.torque, st
    assert st.fault.present == "main_silent"
    _wait_beat(rig)
    st = rig.lane.kernel.status()
    assert st.state == "FAULT" and st.fault.present == "", st  # the cause gone, not the latch
    _ticks(rig, HZ // 2)  # under main_silent_s since: no new fault, still latched
    assert rig.lane.kernel.status().fault.later == 1
    rig.send(Command(2, "clear_fault"))
    wait_in_socket(rig.lane.ports.down)  # ipc, not ticks, decides when it arrives
    replies = [m for m in _ticks(rig, 5) if m["k"] == "reply"]
    assert replies and replies[0]["ok"], replies


def test_a_lane_that_never_heard_a_beat_is_not_judged(rig: LaneRig) -> None:
    rig.send(Command(1, "start"))
    _ticks(rig, 3 * HZ)
    assert rig.lane.kernel.status().state == "RUNNING"


def test_a_full_down_queue_is_counted_not_hidden_on_the_future(tmp_path: Path) -> None:
    """The bridge's sends never wait: a lane that takes nothing (here: none connected, so
    ZeroMQ has nowhere to queue) is a drop, counted, for commands and beats alike. pyzmq's
    asyncio socket puts zmq.Again on the returned future rather than raising it."""
    import anyio
    import zmq.asyncio

    from robotd.lane.messages import Shutdown
    from robotd.runtime.bridge import LaneBridge

    async def main() -> tuple[bool, int]:
        ctx = zmq.asyncio.Context()
        bridge = LaneBridge(ctx, tmp_path)
        try:
            return bridge.send(Shutdown()), bridge.dropped
        finally:
            bridge.close()
            ctx.term()

    sent, dropped = anyio.run(main)
    assert not sent, "a send with nowhere to go reported as sent"
    assert dropped == 1
