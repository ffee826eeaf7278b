"""The Dynamixel and Feetech joint drivers over real pyserial on a pty, against the bus
emulator (in this process, so that faults can be injected while the driver runs)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from drivers.base import DriverFault
from drivers.dynamixel import table as dxt
from drivers.emulators.bus import Emulator
from drivers.feetech import table as ftt
from drivers.servo.calibration import Calibration, JointCalibration, save_calibration
from tests.servo_util import IDS, NAMES, make_driver, write_calibration

TICK = 2 * math.pi / 4096


class Arm:
    def __init__(self, protocol: str, tmp_path, ids=IDS, **options) -> None:
        self.protocol = protocol
        self.emu = Emulator(protocol, ids).start()
        self.cal = write_calibration(tmp_path / "cal.json", protocol)
        self.warnings: list[str] = []
        self.driver = make_driver(protocol, self.emu.port, self.cal, self.warnings, **options)

    def counters(self, joint: str) -> dict[str, int]:
        return self.driver.stats().to_wire().get(joint, {})

    def close(self) -> None:
        self.driver.close()
        self.emu.stop()


@pytest.fixture(params=["dynamixel", "feetech"])
def arm(request, tmp_path):
    a = Arm(request.param, tmp_path)
    a.driver.open()
    yield a
    a.close()


@pytest.fixture(params=["dynamixel", "feetech"])
def plain_arm(request, tmp_path):
    """Each servo answers a SYNC_READ on its own (no FAST_SYNC_READ): faults are per joint."""
    options = {"fast_sync_read": "off"} if request.param == "dynamixel" else {}
    a = Arm(request.param, tmp_path, **options)
    a.driver.open()
    yield a
    a.close()


@pytest.fixture
def dxl_arm(tmp_path):
    a = Arm("dynamixel", tmp_path)
    a.driver.open()
    yield a
    a.close()


def test_open_reads_the_arm_at_its_calibrated_zero_with_torque_off(arm):
    state = arm.driver.read()
    assert state.position.tolist() == [0, 0, 0, 0, 0, 0.5]  # the gripper mid-range
    assert all(not s.torque for s in arm.emu.servos.values())
    assert any("low-latency mode not available" in w for w in arm.warnings)
    assert arm.driver.stats().to_wire() == {}


def test_torque_on_holds_where_the_joints_are_then_goals_move_them(arm):
    arm.driver.torque(True)
    assert all(s.torque and s.target == s.actual for s in arm.emu.servos.values())
    target = np.array([0.4, -0.3, 0.2, -0.1, 0.5, 0.9])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        state = arm.driver.read()
        arm.driver.write(target)
        arrived = np.abs(state.position - target) <= [TICK] * 5 + [1e-3]
        if arrived.all():
            break
    np.testing.assert_allclose(state.position[:5], target[:5], atol=TICK)
    assert abs(state.position[5] - 0.9) < 1e-3
    arm.driver.torque(False)
    assert all(not s.torque for s in arm.emu.servos.values())


def test_goals_are_clipped_to_the_calibrated_range(arm):
    arm.driver.torque(True)
    arm.driver.write(np.array([10.0, -10.0, 0, 0, 0, 5.0]))
    arm.driver.read()  # the sync write has been carried out once the next read is answered
    goals = {i: s.goal() for i, s in arm.emu.servos.items()}
    assert goals[1] == 3072 and goals[2] == 1024 and goals[6] == 3072


@pytest.mark.parametrize(
    ("fault", "counters"),
    [
        ("3:silent:1", {"timeouts": 1, "retries": 1}),
        ("3:checksum:1", {"checksum": 1, "retries": 1}),
    ],
)
def test_a_transient_fault_is_retried_and_counted_against_its_joint(plain_arm, fault, counters):
    plain_arm.emu.inject(fault)
    state = plain_arm.driver.read()
    assert state.position[2] == 0.0
    assert plain_arm.driver.stats().to_wire() == {"elbow_flex": counters}


def test_a_refused_instruction_is_retried(dxl_arm):
    dxl_arm.emu.inject("2:refuse:1")
    dxl_arm.driver.read()
    assert dxl_arm.counters("shoulder_lift") == {"error_bits": 1, "retries": 1}


@pytest.mark.parametrize(("fault", "why"), [("4:silent", "timeout"), ("4:checksum", "checksum")])
def test_a_servo_that_keeps_failing_faults_the_read_after_its_retries(plain_arm, fault, why):
    arm = plain_arm
    arm.emu.inject(fault)
    with pytest.raises(DriverFault, match=rf"wrist_flex \(id 4\): .*{why}") as info:
        arm.driver.read()
    assert info.value.joint == "wrist_flex"
    key = "timeouts" if why == "timeout" else "checksum"
    assert arm.counters("wrist_flex") == {key: 3, "retries": 2}  # 1 try + 2 retries
    assert arm.counters("shoulder_pan") == {}
    arm.emu.clear_faults()
    arm.driver.read()  # the bus recovers once the servo answers again


def test_a_servo_error_is_named_said_once_and_faults_every_read(arm):
    arm.emu.inject("6:error")
    for _ in range(3):
        with pytest.raises(DriverFault, match=r"gripper \(servo 6\).*overload"):
            arm.driver.read()
    said = [w for w in arm.warnings if "servo 6" in w]
    assert len(said) == 1
    if arm.protocol == "dynamixel":
        assert "Hardware Error Status 0x20" in said[0]
    assert arm.counters("gripper")["error_bits"] == 3


def test_echoes_of_our_own_packets_are_discarded(arm):
    arm.emu.inject("echo")
    arm.driver.torque(True)
    for _ in range(5):
        arm.driver.read()
        arm.driver.write(np.zeros(6))
    assert arm.driver.echoes >= 10
    assert arm.driver.stats().to_wire() == {}


def test_a_reply_that_needs_stuffing_reads_right(dxl_arm):
    dxl_arm.emu.inject("2:stuff")
    state = dxl_arm.driver.read()
    # current -1 and velocity -3 put FF FF FD in servo 2's reply: stuffed, unstuffed
    assert state.velocity[1] == pytest.approx(-3 * dxt.VELOCITY_UNIT_RAD_S)
    assert state.effort[1] == pytest.approx(-1 * 0.001)
    assert state.position[1] == 0.0
    assert dxl_arm.driver.stats().to_wire() == {}


def test_fast_sync_read_is_used_where_the_servos_have_it(dxl_arm):
    assert dxl_arm.driver.use_fast_read()
    dxl_arm.emu.inject("5:silent:1")  # a gap in the fast reply: it cannot be read whole
    dxl_arm.driver.read()  # the retry asks each servo (SYNC_READ) and gets every one
    # every joint's read failed once in the broken packet and was read again
    assert dxl_arm.driver.stats().to_wire() == {n: {"checksum": 1, "retries": 1} for n in NAMES}


def test_the_bus_watchdog_stops_the_servos_when_the_driver_goes_quiet(dxl_arm):
    d, emu = dxl_arm.driver, dxl_arm.emu
    d.torque(True)
    assert all(s.table[dxt.BUS_WATCHDOG] == 5 for s in emu.servos.values())  # 100 ms
    d.write(np.array([1.2, 0, 0, 0, 0, 0.5]))
    d.read()
    # the daemon "dies": nothing more is sent; within a watchdog period the servos stop
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with emu.lock:
            emu.device.check_watchdogs(time.monotonic())
            tripped = [s.table[dxt.BUS_WATCHDOG] == 0xFF for s in emu.servos.values()]
        if all(tripped):
            break
    assert all(tripped)
    s1 = emu.servos[1]
    assert s1.target == s1.actual and s1.actual < 2048 + 1.2 / TICK  # stopped short of it
    d.torque(False)
    d.torque(True)  # re-arming clears the tripped watchdog
    assert all(s.table[dxt.BUS_WATCHDOG] == 5 for s in emu.servos.values())


def test_homing_offsets_are_written_at_open_and_read_back_through(tmp_path, request):
    for protocol in ("dynamixel", "feetech"):
        a = Arm(protocol, tmp_path)
        write_calibration(a.cal, protocol, offsets={"shoulder_pan": 100, "elbow_flex": -200})
        try:
            a.driver.open()
            s1, s3 = a.emu.servos[1], a.emu.servos[3]
            if protocol == "dynamixel":
                assert s1.get(dxt.HOMING_OFFSET, 4, signed=True) == 100
                assert s3.get(dxt.HOMING_OFFSET, 4, signed=True) == -200
                shift = (100, -200)  # Present = actual + offset
            else:
                assert ftt.decode_sign_magnitude(s1.get(ftt.HOMING_OFFSET, 2), 11) == 100
                assert s3.get(ftt.HOMING_OFFSET, 2) == 0x0800 | 200  # sign bit 11
                shift = (-100, 200)  # Present = actual - offset
            state = a.driver.read()
            assert state.position[0] == pytest.approx(shift[0] * TICK)
            assert state.position[2] == pytest.approx(shift[1] * TICK)
        finally:
            a.close()


def test_feetech_drive_mode_reverses_direction_in_software(tmp_path):
    a = Arm("feetech", tmp_path)
    cal = Calibration(
        protocol="feetech",
        joints={
            n: JointCalibration(
                id=i,
                homing_offset=0,
                drive_mode=1 if n == "shoulder_pan" else 0,
                range_min=1024,
                range_max=3072,
            )
            for n, i in zip(NAMES, IDS)
        },
    )
    save_calibration(cal, a.cal)
    try:
        a.driver.open()
        a.driver.torque(True)
        a.driver.write(np.array([0.5, 0.5, 0, 0, 0, 0.5]))
        a.driver.read()
        assert a.emu.servos[1].goal() < 2048 < a.emu.servos[2].goal()
    finally:
        a.close()


def test_missing_calibration_refuses_to_open_and_says_how_to_make_one(tmp_path):
    emu = Emulator("feetech", IDS).start()
    try:
        d = make_driver("feetech", emu.port, tmp_path / "none.json")
        with pytest.raises(DriverFault, match=r"no calibration at .*none\.json.*robotd calibrate"):
            d.open()
        with pytest.raises(DriverFault, match="not open"):
            d.torque(True)
    finally:
        emu.stop()


def test_a_calibration_of_other_servos_is_refused(tmp_path):
    cal = write_calibration(tmp_path / "cal.json", "dynamixel", ids=(1, 2, 3, 4, 5, 7))
    d = make_driver("dynamixel", "/dev/null", cal)
    with pytest.raises(DriverFault, match="'gripper' is servo 7 there, 6 in the config"):
        d.open()


KOCH_FOLLOWER = ["xl430-w250"] * 2 + ["xl330-m288"] * 4
PING, READ = 0x01, 0x02  # the same codes in both families


@pytest.mark.parametrize(
    ("protocol", "answers", "wants", "said"),
    [
        # the Koch leader arm (xl330-m077 throughout) on the follower's port
        ("dynamixel", "xl330-m077", KOCH_FOLLOWER, "is a xl330-m077, joints.options.models "
         "says xl430-w250"),
        ("feetech", "sts3250", ["sts3215"] * 6, "is a sts3250, joints.options.models says "
         "sts3215"),
    ],
)
def test_another_arm_on_the_port_is_refused_at_open_before_anything_is_written(
    tmp_path, protocol, answers, wants, said
):
    cal = write_calibration(tmp_path / "cal.json", protocol)
    with Emulator(protocol, IDS, model=answers, baud=0) as emu:
        d = make_driver(protocol, emu.port, cal, models=wants)
        with pytest.raises(DriverFault) as info:
            d.open()
        received = list(emu.received)
    assert f"joint 'shoulder_pan' (servo 1) {said}" in str(info.value)
    assert "Nothing was written to it" in str(info.value) and info.value.joint == "shoulder_pan"
    assert {inst for _, inst in received} <= {PING, READ}, received  # no write, no torque


def test_the_arm_of_the_models_its_config_names_opens(tmp_path):
    cal = write_calibration(tmp_path / "cal.json", "dynamixel")
    with Emulator("dynamixel", IDS, model=KOCH_FOLLOWER, baud=0) as emu:
        d = make_driver("dynamixel", emu.port, cal, models=[m.upper() for m in KOCH_FOLLOWER])
        d.open()  # the names are taken in any case
        d.close()


def test_a_servo_missing_at_open_is_named(tmp_path):
    a = Arm("dynamixel", tmp_path, ids=(1, 2, 3, 4, 5))
    try:
        with pytest.raises(DriverFault, match="joint 'gripper', servo 6: no reply") as info:
            a.driver.open()
        assert info.value.joint == "gripper"
    finally:
        a.close()


def test_an_absent_port_is_a_driver_fault(tmp_path):
    cal = write_calibration(tmp_path / "cal.json", "feetech")
    d = make_driver("feetech", str(tmp_path / "ttyUSB9"), cal)
    with pytest.raises(DriverFault, match="cannot open"):
        d.open()
    d.close()


def test_a_slow_latency_timer_is_named_with_its_fix(tmp_path):
    from drivers.servo.latency import check_latency_timer

    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "ttyUSB0").touch()
    link = dev / "serial-by-id-u2d2"
    link.symlink_to(dev / "ttyUSB0")
    timer = tmp_path / "sys" / "ttyUSB0" / "latency_timer"
    timer.parent.mkdir(parents=True)
    timer.write_text("16\n")
    warning = check_latency_timer(str(link), tmp_path / "sys", fix=False)
    assert warning is not None and "16 ms" in warning and f"echo 1 | sudo tee {timer}" in warning
    assert check_latency_timer(str(link), tmp_path / "sys") is None  # writable here: set to 1
    assert timer.read_text().strip() == "1"
    assert check_latency_timer(str(dev / "ttyACM0"), tmp_path / "sys") is None  # no timer


def test_a_late_reply_to_an_earlier_transaction_is_not_taken_for_this_one():
    import os
    import threading

    from drivers.dynamixel import packet as dxp
    from drivers.dynamixel.codec import DynamixelCodec
    from drivers.servo.bus import ServoBus
    from drivers.servo.transport import SerialTransport
    from tests.servo_util import RawPty

    pty = RawPty()
    transport = SerialTransport(pty.path, 1_000_000)
    transport.open()
    bus = ServoBus(DynamixelCodec(), transport, slack_s=5.0, return_delay_s=0)
    request = dxp.read(1, 132, 4)

    def servo() -> None:
        assert pty.take(len(request)) == request
        # the status of an earlier write (no data) comes late, then the read's own
        late, own = dxp.status_packet(1, 0), dxp.status_packet(1, 0, (166).to_bytes(4, "little"))
        os.write(pty.master, late + own)

    t = threading.Thread(target=servo)
    t.start()
    try:
        assert bus.read(1, 132, 4) == (166).to_bytes(4, "little")
    finally:
        t.join(5)
        transport.close()
        pty.close()


def test_a_late_reply_of_another_length_is_not_taken_for_a_sync_read():
    """A Bus Watchdog check (one byte) answered late, during the next tick's state read."""
    import os
    import threading

    from drivers.dynamixel import packet as dxp
    from drivers.dynamixel.codec import DynamixelCodec
    from drivers.servo.bus import ServoBus
    from drivers.servo.transport import SerialTransport
    from tests.servo_util import RawPty

    pty = RawPty()
    transport = SerialTransport(pty.path, 1_000_000)
    transport.open()
    bus = ServoBus(DynamixelCodec(), transport, slack_s=5.0, return_delay_s=0)
    address, length = dxt.STATE_BLOCK
    request = dxp.sync_read(address, length, [1], fast=False)
    state = bytes(range(length))

    def servo() -> None:
        assert pty.take(len(request)) == request
        late, own = dxp.status_packet(1, 0, b"\xff"), dxp.status_packet(1, 0, state)
        os.write(pty.master, late + own)

    t = threading.Thread(target=servo)
    t.start()
    try:
        out = bus.sync_read(address, length, [1])
        assert out.replies[1].data == state
    finally:
        t.join(5)
        transport.close()
        pty.close()
