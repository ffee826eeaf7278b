"""Torque off with one servo gone (an e-stop onto a damaged chain), over real pyserial on
a pty against the bus emulator: every servo that answers is let go, and the fault names
the one that did not; the next try (the control lane's next tick) lets that one go too
once it answers."""

from __future__ import annotations

import pytest

from drivers.base import DriverFault
from tests.test_servo_driver import Arm


@pytest.fixture(params=["dynamixel", "feetech"])
def arm(request, tmp_path):
    a = Arm(request.param, tmp_path)
    a.driver.open()
    a.driver.torque(True)
    yield a
    a.close()


def torque(arm: Arm) -> dict[int, bool]:
    with arm.emu.lock:
        return {i: s.torque for i, s in arm.emu.servos.items()}


def test_torque_off_lets_go_of_every_servo_that_answers(arm):
    assert all(torque(arm).values())
    arm.emu.inject("3:silent")  # the elbow's servo answers nothing, for good
    with pytest.raises(DriverFault) as err:
        arm.driver.torque(False)
    assert "torque off" in str(err.value) and "elbow_flex" in str(err.value)
    assert err.value.joint == "elbow_flex"
    # (the emulated servo 3 carries out what it hears, answering nothing: not judged)
    assert {i: on for i, on in torque(arm).items() if i != 3} == dict.fromkeys(
        (1, 2, 4, 5, 6), False
    )
    arm.emu.clear_faults()
    arm.driver.torque(False)
    assert not any(torque(arm).values())
