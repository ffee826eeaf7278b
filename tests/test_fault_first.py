"""The fault shown is the first cause latched (the one that stopped the robot); later
causes follow it in a bounded form (their count and the latest), and clear_fault resets
it. The kernel tick by tick, the words operators read, and a real daemon over its socket."""

from __future__ import annotations

import numpy as np
import pytest

from drivers.base import JointState
from robotd.config import load_config
from robotd.control.episode import CommandRefused
from robotd.control.kernel import Kernel
from robotd.control.playback import Chunk
from robotd.operator.robotctl import ControlClient
from robotd.operator.words import fault_words, is_estop
from tests.daemon_util import Daemon
from tests.lane_util import plain
from tests.robotctl_util import robotctl

DT_NS = 33_333_333


class Rig:
    def __init__(self, *overrides: str) -> None:
        cfg = load_config(None, ['control.timing="sync"', *overrides])
        self.out: list[dict] = []
        self.k = Kernel(cfg, run_id="t", emit=lambda m: self.out.append(plain(m)))
        self.t = 0
        self.pos = np.array([0.1, 0.2, 0.0])
        self.cameras = list(cfg.cameras)

    def tick(self, *, joints: bool = True) -> None:
        self.t += DT_NS
        js = JointState(self.pos.copy(), np.zeros(3), np.zeros(3), self.t) if joints else None
        self.k.update(self.t, js, {n: (self.t // DT_NS, self.t) for n in self.cameras})

    def faults(self) -> list[dict]:
        return [m for m in self.out if m["k"] == "event" and m["name"] == "fault"]

    def shown(self) -> dict:
        return plain(self.k.status())["fault"]


def _safety_fault(rig: Rig) -> None:
    rig.k.set_contract(4)
    rig.tick()
    ask = next(m for m in rig.out if m["k"] == "ask")
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], np.full((4, 3), 9.0)))
    rig.tick()
    rig.tick()
    assert rig.k.machine.state == "FAULT" and rig.k.machine.fault.cause == "safety"


def test_estops_after_a_safety_fault_leave_the_safety_fault_shown() -> None:
    rig = Rig("safety.reject_run=2", "safety.estop_category=0")
    _safety_fault(rig)
    first = rig.shown()["detail"]
    for reason in ("reason A", "reason B", "reason C"):
        rig.k.command("estop", reason)
    f = rig.shown()
    assert (f["cause"], f["detail"], f["active"]) == ("safety", first, False)
    assert (f["later"], f["latest_cause"], f["latest_detail"]) == (3, "estop", "reason C")
    words = fault_words(f)
    assert words.startswith("safety shield: rejected actions: 2 rejected actions in a row")
    assert "; also: e-stop 'reason C' (+2 more) (clear_fault to leave)" in words
    # every later cause is logged, saying what it came after
    later = [e for e in rig.faults() if e.get("after") == "safety"]
    assert [e["detail"] for e in later] == ["reason A", "reason B", "reason C"]
    assert not rig.k.torque_on  # the e-stops still applied their category


def test_an_estop_after_another_cause_still_marks_the_robot_e_stopped() -> None:
    # watch's E-STOP tag: the fault shown is the safety fault, yet the robot is e-stopped
    rig = Rig("safety.reject_run=2", "safety.estop_category=0")
    _safety_fault(rig)
    assert not is_estop({"fault": rig.shown()})
    rig.k.command("estop", "pressed at the bench")
    assert rig.shown()["cause"] == "safety" and is_estop({"fault": rig.shown()})
    rig.k.command("clear_fault")
    assert rig.shown() is None
    rig.k.command("estop", "again")
    assert is_estop({"fault": rig.shown()})


def test_clear_fault_resets_the_first_cause_and_the_later_ones() -> None:
    rig = Rig("safety.estop_category=0")
    rig.k.set_contract(4)
    rig.tick()
    rig.k.command("estop", "operator one")
    rig.k.command("estop", "operator two")
    assert rig.shown()["detail"] == "operator one" and rig.shown()["later"] == 1
    assert rig.k.command("clear_fault").fault is None
    rig.k.command("estop", "operator three")
    f = rig.shown()
    assert (f["detail"], f["later"], f["latest_cause"], f["latest_detail"]) == (
        "operator three", 0, "", "")
    assert fault_words(f) == "e-stop: operator three (clear_fault to leave)"


def test_a_driver_fault_after_an_estop_is_counted_once_and_blocks_clearing() -> None:
    rig = Rig("safety.driver_fault_run=3", "safety.estop_category=1")
    rig.k.set_contract(4)
    rig.tick()
    rig.k.command("estop", "bench")
    for _ in range(20):  # the driver keeps failing: one later cause, not one a tick
        rig.tick(joints=False)
    f = rig.shown()
    assert (f["cause"], f["detail"]) == ("estop", "bench")
    assert (f["later"], f["latest_cause"], f["active"]) == (1, "driver", True)
    assert f["present"] == "driver"
    assert f["latest_detail"] == "3 failed joint reads in a row"
    assert len([e for e in rig.faults() if e["cause"] == "driver"]) == 1
    assert fault_words(f).endswith(
        "; also: joint driver fault '3 failed joint reads in a row' "
        "(joint driver fault still present: cannot be cleared yet)")
    with pytest.raises(CommandRefused, match="driver still present"):
        rig.k.command("clear_fault")
    rig.tick()  # a good read: the driver is back
    assert not rig.shown()["active"]
    assert rig.k.command("clear_fault").state == "IDLE"


def test_a_first_driver_fault_stays_shown_and_present_until_it_reads_again() -> None:
    rig = Rig("safety.driver_fault_run=2", "safety.estop_category=0")
    rig.k.set_contract(4)
    rig.tick()
    rig.tick(joints=False)
    rig.tick(joints=False)
    rig.k.command("estop", "after the driver")
    f = rig.shown()
    assert (f["cause"], f["active"], f["later"], f["latest_detail"]) == (
        "driver", True, 1, "after the driver")
    assert fault_words(f).endswith("(still present: cannot be cleared yet)")


def test_a_real_cause_takes_the_start_up_latch_s_place() -> None:
    """The start-up latch stopped nothing (nothing had moved): an e-stop on a robot that
    started latched is the fault's first cause, and the next one comes after it."""
    rig = Rig('robot.start="latched"', "safety.estop_category=0")
    assert rig.shown()["cause"] == "startup"
    rig.tick()
    rig.k.command("estop", "arm sagging")
    rig.k.command("estop", "again")
    f = rig.shown()
    assert (f["cause"], f["detail"], f["later"], f["latest_detail"]) == (
        "estop", "arm sagging", 1, "again")
    assert [e.get("after") for e in rig.faults()] == [None, "estop"]


def test_the_words_never_raise_on_hostile_later_fields() -> None:
    for later in (None, -3, True, "7", 2**70, 1.5, [1]):
        for latest in (None, 5, b"\x1b[2J", "estop", {"x": 1}):
            words = fault_words({"cause": "estop", "detail": "d", "later": later,
                                 "latest_cause": latest, "latest_detail": latest,
                                 "active": True, "present": latest})
            assert words.startswith("e-stop: d") and "\x1b" not in words


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("ff"), "--set", 'robot.start="latched"',
               "--set", "safety.estop_category=0")
    d.wait_line(r"operator socket")
    yield d
    d.signal()
    assert d.wait_exit() == 0


def test_status_over_the_socket_shows_the_first_estop_and_the_later_ones(daemon) -> None:
    c = ControlClient(daemon.control_endpoint, timeout_s=15)
    try:
        assert c.request("clear_fault")["result"]["state"] == "IDLE"
        for reason in ("first press", "second press", "third press"):
            assert c.request("estop", {"reason": reason})["ok"]
        f = c.request("status")["result"]["fault"]
        assert (f["cause"], f["detail"]) == ("estop", "first press"), f
        assert (f["later"], f["latest_detail"]) == (2, "third press"), f
        out, _ = robotctl("status", "--endpoint", daemon.control_endpoint, "--timeout", "15")
        assert "e-stop: first press; also: e-stop 'third press' (+1 more)" in out.stdout, out
        daemon.wait_line(r"fault .*'third press'.*'after': 'estop'")  # all of them logged
        assert c.request("clear_fault")["result"]["fault"] is None
        assert c.request("estop", {"reason": "fresh"})["result"]["fault"]["later"] == 0
    finally:
        c.close()
