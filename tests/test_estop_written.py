"""An e-stop is acknowledged as written only when its safe command went out: when the
driver raises on that write (a bus unplugged, a pty whose other end closed), the answer
says so (ok false, code not_written, the driver's error), on lane.sock and to the main
process alike, and the e-stop stays latched. A later tick that writes it answers ok.

The lane here is the real ControlLane on config/sim.toml; its sim driver is made to fail
its writes by replacing the driver's torque/write with ones that raise OSError, as a
serial bus with nothing on the other end does (tests/test_estop_bus_e2e.py makes a real
emulated bus fail the same way, end to end through robotctl)."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from robotd.lane import codec
from robotd.lane.messages import NOT_WRITTEN, Command, Estop, Reply
from tests.test_lane import LaneRig, wait_in_socket


def _eio(*_: Any) -> None:
    raise OSError(5, "Input/output error")


@pytest.fixture(params=[0, 1], ids=["category-0", "category-1"])
def rig(request: pytest.FixtureRequest) -> Iterator[LaneRig]:
    """A lane running an episode (torque on); category 0 turns torque off at the e-stop,
    1 holds the last target first (both a write the driver owes)."""
    with tempfile.TemporaryDirectory(prefix="rbt-estop-") as tmp:
        r = LaneRig(Path(tmp), 'robot.start="idle"', f"safety.estop_category={request.param}")
        r.tick()
        assert r.lane.kernel.torque_on
        yield r
        r.close()


def _dead_bus(rig: LaneRig) -> None:
    rig.lane.driver.torque = _eio  # type: ignore[method-assign]
    rig.lane.driver.write = _eio  # type: ignore[method-assign]


def _estop_reply(rig: LaneRig) -> Reply:
    assert rig.estop.poll(5000), "no answer on lane.sock"
    reply = codec.decode_up(rig.estop.recv())
    assert isinstance(reply, Reply)
    return reply


def test_an_estop_on_lane_sock_the_driver_cannot_write_is_not_acknowledged(rig) -> None:
    _dead_bus(rig)
    rig.estop.send(codec.encode(Estop(7, "bus gone")))
    wait_in_socket(rig.lane.ports.estop)
    rig.tick()
    reply = _estop_reply(rig)
    assert (reply.id, reply.ok, reply.code, reply.written_ns) == (7, False, NOT_WRITTEN, None)
    assert "Input/output error" in reply.message and "may NOT be stopped" in reply.message
    assert reply.status is not None and reply.status.state == "FAULT"  # latched all the same


def test_an_estop_from_the_main_process_is_answered_after_the_write_and_says_it_failed(
    rig,
) -> None:
    _dead_bus(rig)
    rig.send(Command(3, "estop", reason="bus gone"))
    wait_in_socket(rig.lane.ports.down)
    replies = [m for m in rig.tick() if m.get("k") == "reply"]
    assert len(replies) == 1, replies
    assert replies[0]["id"] == 3 and replies[0]["ok"] is False
    assert replies[0]["code"] == NOT_WRITTEN and "OSError" in replies[0]["message"]


def test_an_estop_the_driver_writes_is_acknowledged_with_when(rig) -> None:
    rig.send(Command(3, "estop", reason="hand in the way"))
    wait_in_socket(rig.lane.ports.down)
    (reply,) = [m for m in rig.tick() if m.get("k") == "reply"]
    assert reply["ok"] is True and reply["written_ns"] == rig.lane.io.done_ns
    rig.estop.send(codec.encode(Estop(8, "again")))
    wait_in_socket(rig.lane.ports.estop)
    rig.tick()
    again = _estop_reply(rig)
    assert again.ok and again.written_ns == rig.lane.io.done_ns


def test_an_estop_between_ticks_the_driver_cannot_write_is_not_acknowledged(rig) -> None:
    _dead_bus(rig)
    sleeping = threading.Event()
    t = threading.Thread(target=lambda: (sleeping.set(), rig.lane.estops.sleep(2.0)))
    t.start()
    assert sleeping.wait(5)
    rig.estop.send(codec.encode(Estop(9, "now")))
    reply = _estop_reply(rig)
    t.join(10)
    assert not reply.ok and reply.code == NOT_WRITTEN and reply.id == 9


def _tick_until_stopped(rig: LaneRig, most: int) -> int:
    """Ticks until the lane sets its stop (at most `most`); how many it took."""
    for n in range(1, most + 1):
        rig.tick()
        if rig.lane.stop.is_set():
            return n
    raise AssertionError(f"the lane did not stop within {most} ticks")


def test_an_orphaned_lane_whose_bus_is_gone_estops_once_then_exits_saying_so(rig, caplog):
    """The main process gone and the bus with it: the lane holds orphan_s, e-stops (once,
    not every tick), tries the torque-off every tick for ORPHAN_WRITE_S, then exits
    saying it could not write it, instead of holding lane.sock and the port forever."""
    from robotd.control.process import ORPHAN_WRITE_S

    _dead_bus(rig)
    rig.lane.orphaned.set()
    hz, orphan_s = rig.cfg.control.hz, rig.cfg.control.orphan_s
    with caplog.at_level("CRITICAL", logger="robotd.control"):
        took = _tick_until_stopped(rig, round((orphan_s + ORPHAN_WRITE_S + 2) * hz))
    assert took >= (orphan_s + ORPHAN_WRITE_S) * hz
    assert "torque off could not be written" in caplog.text and "OSError" in caplog.text
    fault = rig.lane.kernel.status().fault
    assert fault is not None and fault.later <= 1  # the e-stop latched once, not per tick
    assert not rig.lane.kernel.torque_on and rig.lane.io.torque  # wanted off, never written


def test_an_orphaned_lane_exits_once_torque_off_is_written(rig) -> None:
    rig.lane.orphaned.set()
    hz, orphan_s = rig.cfg.control.hz, rig.cfg.control.orphan_s
    took = _tick_until_stopped(rig, round((orphan_s + 3) * hz))
    assert not rig.lane.io.torque and took < (orphan_s + 3) * hz


def test_a_category_1_stop_turns_torque_off_on_time_while_every_read_fails(rig) -> None:
    if rig.cfg.safety.estop_category != 1:
        pytest.skip("category 1 only: 0 turns torque off at the e-stop itself")
    rig.lane.driver.read = _eio  # type: ignore[method-assign]
    rig.send(Command(3, "estop", reason="reads failing"))
    wait_in_socket(rig.lane.ports.down)
    for _ in range(rig.lane.kernel.latch.stop_ticks + 2):
        rig.tick()
    assert not rig.lane.kernel.torque_on and not rig.lane.io.torque
