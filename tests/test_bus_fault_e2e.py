"""A bus fault in a running daemon: a real arm's config (config/so101.toml, config/koch.toml)
run by `robotd run` on the bus emulator, an episode under way, then one servo stops
answering (or answers with bad checksums) for good. Past `safety.driver_fault_run` failed
reads the daemon latches FAULT with the driver as its cause, names the joint, writes no new
target (every goal after it is the one it held) and stays up; once the bus is healthy
again the fault clears and the next episode moves the arm.

The emulator runs in this process (drivers.emulators.bus.Emulator, a real pty) rather than
as `--emulate`'s child, so that the test can inject the fault while the daemon runs and
see every goal the daemon writes; the config is pointed at it exactly as `--emulate`
points it (robotd.runtime.emulate: the port, a calibration of the emulated arm, the
cameras on their test pattern)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from drivers.dynamixel import packet as dxl_packet
from drivers.dynamixel import table as dxl_table
from drivers.emulators.bus import Emulator
from drivers.feetech import packet as sts_packet
from drivers.servo.calibration import save_calibration
from drivers.servo.frames import Frame
from robotd.config import load_config
from robotd.operator.client import ControlClient
from robotd.runtime.emulate import emulated_calibration
from tests.daemon_util import REPO, Daemon, lane_pid

ARMS = {"so101": "feetech", "koch": "dynamixel"}
SYNC_WRITE = {"feetech": sts_packet.SYNC_WRITE, "dynamixel": dxl_packet.SYNC_WRITE}
JOINT, IDENT = "elbow_flex", 3  # the servo that fails


class Goals:
    """Every goal sync write the emulator carries out, as the servos' Goal Position
    registers right after it; waited on (a condition), never slept for."""

    def __init__(self, emu: Emulator) -> None:
        self.cond = threading.Condition()
        self.seen: list[tuple[int, ...]] = []
        handle, servos = emu.device.handle, emu.servos
        opcode = SYNC_WRITE[emu.protocol]

        def recording(frame: Frame, now: float, faults: object) -> list:
            out = handle(frame, now, faults)  # type: ignore[arg-type]
            if frame.head == opcode:
                with self.cond:
                    self.seen.append(tuple(s.goal() for s in servos.values()))
                    self.cond.notify_all()
            return out

        emu.device.handle = recording  # type: ignore[method-assign]

    def count(self) -> int:
        with self.cond:
            return len(self.seen)

    def wait(self, n: int, timeout: float = 30.0) -> list[tuple[int, ...]]:
        """Once at least `n` writes were seen: all of them."""
        with self.cond:
            ok = self.cond.wait_for(lambda: len(self.seen) >= n, timeout)
            assert ok, f"{len(self.seen)} goal writes within {timeout} s, wanted {n}"
            return list(self.seen)


@dataclass
class Rig:
    emu: Emulator
    goals: Goals
    daemon: Daemon
    client: ControlClient


@pytest.fixture(params=list(ARMS))
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    """The arm's config run by the daemon on an emulator of this process."""
    config = REPO / "config" / f"{request.param}.toml"
    cfg = load_config(config)
    calibration = tmp_path / "calibration.json"
    save_calibration(emulated_calibration(cfg), calibration)
    opts = cfg.joints.options
    emu = Emulator(ARMS[request.param], opts["ids"], model=opts.get("models"))  # the arm's own
    goals = Goals(emu)
    emu.start()
    sets = [f'joints.options.port="{emu.port}"', f'joints.options.calibration="{calibration}"']
    sets += [f'cameras.{name}.options.fallback="pattern"' for name in cfg.cameras]
    # The emulator shares this process's GIL, and on a loaded machine a thread holding it
    # can be preempted for tens of ms: a slow tick (10 Hz) and reads that wait 40 ms, so
    # that only the injected fault fails a read (the budget within the 100 ms tick and the
    # Bus Watchdog over two of them, as the config check demands).
    sets += ["control.hz=10", "joints.options.timeout_ms=40", "joints.options.budget_ms=80"]
    if ARMS[request.param] == "dynamixel":
        sets += ["joints.options.watchdog_ms=300"]
    d = Daemon(tmp_path, "--config", str(config), *(a for s in sets for a in ("--set", s)))
    client = None
    try:
        d.wait_line(r"operator socket", timeout=60)
        client = ControlClient(d.control_endpoint, timeout_s=15)
        yield Rig(emu, goals, d, client)
    finally:
        if client is not None:
            client.close()
        d.signal()
        code = d.wait_exit()
        emu.stop()
    assert code == 0, "".join(d.log[-30:])  # a clean stop, the fault notwithstanding


def ok(rig: Rig, cmd: str) -> dict:
    reply = rig.client.request(cmd)
    assert reply["ok"], reply
    return reply.get("result") or {}


def start_moving(rig: Rig) -> None:
    """clear_fault + start, then wait until the arm is moving (new goals written)."""
    ok(rig, "clear_fault")
    ok(rig, "start")
    rig.daemon.wait_line(r"episode_start", timeout=30)
    n = rig.goals.count()
    deadline = time.monotonic() + 60
    while len(set(rig.goals.wait(n + 10)[n:])) < 3:  # Wave: every tick a new target
        n += 10
        assert time.monotonic() < deadline, "the arm does not move"


def wait_status(rig: Rig, check: Callable[[dict], bool], timeout: float = 30.0) -> dict:
    """The daemon's status once `check` holds (it reports the lane's status with its
    statistics, every control.stats_interval_s: there is no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not check(status := ok(rig, "status")):
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    return status


@pytest.mark.parametrize("kind", ["silent", "checksum"])
def test_a_servo_that_fails_for_good_faults_the_running_robot_which_holds(rig, kind):
    start_moving(rig)
    rig.emu.inject(f"{IDENT}:{kind}")  # every reply from now on: none, or a corrupt one
    # the episode ends as a fault, then the fault itself (events, in this order)
    rig.daemon.wait_line(r"episode_end \{.*'outcome': 'fault', 'cause': 'driver'", timeout=30)
    line = rig.daemon.wait_line(r"\bfault \{.*'cause': 'driver'", timeout=30)
    assert "failed joint reads in a row" in line
    held_from = rig.goals.count()  # every write since the failures began was the hold
    status = wait_status(rig, lambda s: s["state"] != "RUNNING")
    assert status["state"] == "FAULT" and status["fault"]["cause"] == "driver"
    assert status["fault"]["active"] is True
    # a second of ticks later: nothing new was commanded, every goal is the held one
    after = rig.goals.wait(held_from + 30)[held_from - 1 :]
    assert len(set(after)) == 1, f"goals changed after the fault: {sorted(set(after))[:4]}"
    # the joint at fault named, with what went wrong, in the driver's counters (the log's
    # driver_error lines are rate-limited: an earlier one may stand for this one)
    counter = "timeouts" if kind == "silent" else "checksum"
    assert ok(rig, "stats")["driver"][JOINT][counter] >= 3
    # the daemon is up and refuses to clear a fault whose cause is still there
    assert rig.daemon.proc.poll() is None
    refused = rig.client.request("clear_fault")
    assert not refused["ok"] and "still present" in str(refused["error"]), refused
    # the bus healthy again: the fault can be cleared and the next episode moves the arm
    rig.emu.clear_faults()
    wait_status(rig, lambda s: not s["fault"]["active"])
    start_moving(rig)
    assert rig.daemon.proc.poll() is None


@pytest.mark.parametrize("rig", ["koch"], indirect=True)
def test_a_stalled_control_lane_leaves_the_servos_stopped_and_re_arms_them_after(rig):
    """The control process stops for longer than the Bus Watchdog (300 ms here): every
    Dynamixel stops by itself and ignores goals. Once the lane runs again its driver
    re-arms them (a warning says so) and its goals move the arm again."""
    start_moving(rig)
    lane = lane_pid(rig.daemon)
    os.kill(lane, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # the stall under test (no packet for 1 s), not a wait
    finally:
        os.kill(lane, signal.SIGCONT)
    line = rig.daemon.wait_line(r"driver_warning .*had stopped by themselves", timeout=30)
    assert "Bus Watchdog tripped" in line and "Re-armed" in line, line
    with rig.emu.lock:
        assert {s.table[dxl_table.BUS_WATCHDOG] for s in rig.emu.servos.values()} == {15}
    n = rig.goals.count()  # every tick a new target, taken by the servos again
    deadline = time.monotonic() + 60
    while len(set(rig.goals.wait(n + 10)[n:])) < 3:
        n += 10
        assert time.monotonic() < deadline, ("the arm does not move", ok(rig, "status"))
    trips = ok(rig, "stats")["driver"]
    assert len(trips) == len(rig.emu.servos), trips
    assert all(trips[j]["watchdog_trips"] >= 1 for j in trips), trips
