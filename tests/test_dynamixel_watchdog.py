"""The Dynamixel Bus Watchdog over real pyserial on a pty, against the bus emulator: a bus
that went quiet longer than `watchdog_ms` leaves every servo stopped by itself and deaf to
goals (register 98 at 0xFF). The driver notices at its next whole read, re-arms the ones
that tripped, counts and says it, and its goals move the arm again; on a healthy bus it
reads nothing more than the state.

The quiet spell is made by not calling the driver for a while (time.sleep): that silence
is the fault under test, not a wait for something to happen."""

from __future__ import annotations

import math
import struct
import time

import numpy as np
import pytest

from drivers.dynamixel import packet as dxp
from drivers.dynamixel import table as dxt
from drivers.emulators.faults import parse_fault
from drivers.servo.frames import Frame
from tests.daemon_util import wait_until
from tests.servo_util import IDS, NAMES
from tests.test_servo_driver import Arm

TICK = 2 * math.pi / 4096
TARGET = np.array([0.4, -0.3, 0.2, -0.1, 0.5, 0.9])
# A watchdog of 1 s: a loaded machine's pauses between a test's reads (tens of ms) are far
# from its 0.75 s that would be looked into, or its 1 s that trips it; the stall is 1.5 s.
WATCHDOG_MS = 1000
UNITS = WATCHDOG_MS // dxt.WATCHDOG_UNIT_MS
QUIET_S = 1.5


@pytest.fixture
def arm(tmp_path):
    a = Arm("dynamixel", tmp_path, watchdog_ms=WATCHDOG_MS)
    a.driver.open()
    a.driver.torque(True)
    yield a
    a.close()


def drive(arm: Arm, seconds: float) -> np.ndarray:
    """Read and write TARGET for up to `seconds`, until the arm is there; the last read."""
    deadline = time.monotonic() + seconds
    while True:
        position = arm.driver.read().position
        arm.driver.write(TARGET)
        there = np.abs(position - TARGET) <= [TICK] * 5 + [1e-3]
        if there.all() or time.monotonic() > deadline:
            return position


def write_heard(arm: Arm) -> None:
    """Write TARGET (a sync write: no reply) and wait until the emulator carried it out."""
    before = arm.emu.instructions
    arm.driver.write(TARGET)
    wait_until(lambda: arm.emu.instructions > before, 10, "the emulator to take the write")


def registers(arm: Arm) -> dict[int, int]:
    with arm.emu.lock:
        return {i: s.table[dxt.BUS_WATCHDOG] for i, s in arm.emu.servos.items()}


def sync_reads_of(arm: Arm, address: int) -> list[Frame]:
    """Record the SYNC_READs of `address` the emulator is sent from now on."""
    seen: list[Frame] = []
    handle = arm.emu.device.handle

    def recording(frame, now, faults):
        if frame.head == dxp.SYNC_READ and struct.unpack_from("<H", frame.params)[0] == address:
            seen.append(frame)
        return handle(frame, now, faults)

    arm.emu.device.handle = recording
    return seen


def test_a_quiet_bus_stops_the_arm_and_the_next_read_re_arms_it(arm):
    units = registers(arm)
    assert set(units.values()) == {UNITS}  # armed with the torque
    arm.driver.read()
    arm.driver.write(TARGET)
    time.sleep(QUIET_S)  # robotd stalled: nothing on the bus
    write_heard(arm)  # the emulator finds its watchdogs tripped
    assert set(registers(arm).values()) == {0xFF}
    with arm.emu.lock:
        stopped = {i: s.target for i, s in arm.emu.servos.items()}
    write_heard(arm)
    with arm.emu.lock:
        assert {i: s.target for i, s in arm.emu.servos.items()} == stopped  # goals ignored
    position = drive(arm, 20)
    np.testing.assert_allclose(position[:5], TARGET[:5], atol=TICK)
    assert abs(position[5] - 0.9) < 1e-3
    arm.driver.read()  # (a pause past the period meanwhile would be re-armed by it)
    assert set(registers(arm).values()) == {UNITS}
    said = [w for w in arm.warnings if "Bus Watchdog tripped" in w]
    assert len(said) == 1, arm.warnings
    assert all(f"{n} (servo {i})" in said[0] for n, i in zip(NAMES, IDS)), said[0]
    assert "watchdog_ms" in said[0] and "Re-armed" in said[0]
    quiet_ms = int(said[0].split("the bus was quiet ")[1].split(" ms")[0])
    assert quiet_ms >= QUIET_S * 1e3
    assert {n: arm.counters(n).get("watchdog_trips") for n in NAMES} == dict.fromkeys(NAMES, 1)


def test_a_healthy_bus_reads_nothing_but_the_state(tmp_path):
    # the longest period (2.54 s): a loaded machine's pauses between this loop's reads are
    # quiet spells, and only one of 1.9 s would be looked into
    arm = Arm("dynamixel", tmp_path, watchdog_ms=2540)
    arm.driver.open()
    arm.driver.torque(True)
    try:
        _reads_nothing_but_the_state(arm)
    finally:
        arm.close()


def _reads_nothing_but_the_state(arm: Arm) -> None:
    seen = sync_reads_of(arm, dxt.BUS_WATCHDOG)
    end = time.monotonic() + 1.0
    reads = 0
    while time.monotonic() < end:
        arm.driver.read()
        arm.driver.write(TARGET)
        reads += 1
    assert reads > 10
    assert seen == []
    assert not [w for w in arm.warnings if "Bus Watchdog" in w]
    assert all("watchdog_trips" not in arm.counters(n) for n in NAMES)


def test_a_servo_that_misses_the_check_is_checked_after_the_next_read(arm):
    seen = sync_reads_of(arm, dxt.BUS_WATCHDOG)
    recording = arm.emu.device.handle

    def gripper_silent_at_the_first_check(frame, now, faults):
        if frame.head == dxp.SYNC_READ and not seen:  # the state is read by FAST_SYNC_READ
            faults.items.append(parse_fault("6:silent:1"))
        return recording(frame, now, faults)

    arm.emu.device.handle = gripper_silent_at_the_first_check
    arm.driver.read()
    time.sleep(QUIET_S)  # robotd stalled
    write_heard(arm)  # tripped
    arm.driver.read()  # the check: the gripper does not answer it
    assert len(seen) == 1
    units = registers(arm)
    assert units[6] == 0xFF and {units[i] for i in IDS[:5]} == {UNITS}
    arm.driver.write(TARGET)
    arm.driver.read()  # checked again: the gripper alone
    assert len(seen) == 2 and list(seen[1].params[4:]) == [6]
    assert set(registers(arm).values()) == {UNITS}
    position = drive(arm, 20)
    assert abs(position[5] - 0.9) < 1e-3
    assert {n: arm.counters(n).get("watchdog_trips") for n in NAMES} == dict.fromkeys(NAMES, 1)


def test_torque_off_disarms_it(arm):
    arm.driver.torque(False)
    assert set(registers(arm).values()) == {0}
    time.sleep(QUIET_S)
    arm.driver.read()
    assert set(registers(arm).values()) == {0}
    assert not [w for w in arm.warnings if "Bus Watchdog" in w]
