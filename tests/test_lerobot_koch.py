"""LeRobot's calibration of a Koch arm (Dynamixel, Protocol 2.0) imported and driven: the
drive mode (direction) of the joints LeRobot reverses is written to each servo's Drive
Mode register, so that a reversed joint reads and moves the other way round, and nothing
reverses it a second time in software."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from drivers.dynamixel import table as dxt
from drivers.emulators.bus import Emulator
from drivers.servo.calibration import load_calibration, save_calibration
from drivers.servo.lerobot import import_lerobot
from tests.servo_util import IDS, NAMES, make_driver
from tests.test_calibrate import KEYS, copy_config, run_cli

SCALE = 2 * math.pi / 4096
# LeRobot's format (one object per motor, raw ticks). Ranges are centred on where the
# emulated shafts start (2048): present = offset + shaft, or offset + 4096 − shaft when the
# joint is reversed (drive_mode 1), so every joint starts at 0 rad (grippers mid-range).
LEROBOT_KOCH = {
    name: dict(zip(KEYS, values))
    for name, values in {
        "shoulder_pan": (1, 0, 0, 1048, 3048),
        "shoulder_lift": (2, 1, 1000, 2048, 4048),
        "elbow_flex": (3, 1, -500, 548, 2548),
        "wrist_flex": (4, 0, 300, 1348, 3348),
        "wrist_roll": (5, 0, 0, 48, 4048),
        "gripper": (6, 1, 200, 1748, 2748),
    }.items()
}
REVERSED = np.array([LEROBOT_KOCH[n]["drive_mode"] == 1 for n in NAMES])
ROTARY = np.array([n != "gripper" for n in NAMES])


@pytest.fixture
def koch_calibration(tmp_path: Path) -> Path:
    """robotd's calibration imported from LeRobot's file, written for the driver."""
    lerobot = tmp_path / "koch_follower.json"
    lerobot.write_text(json.dumps(LEROBOT_KOCH))
    cal = import_lerobot(lerobot, "dynamixel", NAMES)
    assert [cal.joints[n].drive_mode for n in NAMES] == list(REVERSED.astype(int))
    path = tmp_path / "koch.calibration.json"
    save_calibration(cal, path)
    return path


def _shafts(emu: Emulator, delta: float) -> None:
    """Turn every shaft by `delta` encoder ticks (the arm moved by hand, torque off)."""
    with emu.lock:
        for s in emu.servos.values():
            s.actual += delta


def test_the_drive_mode_goes_into_the_servos(koch_calibration):
    with Emulator("dynamixel", IDS) as emu:
        d = make_driver("dynamixel", emu.port, koch_calibration, watchdog_ms=0)
        d.open()
        try:
            state = d.read()
        finally:
            d.close()
        for i, name in zip(IDS, NAMES):
            src = LEROBOT_KOCH[name]
            assert emu.servos[i].table[dxt.DRIVE_MODE] & 1 == src["drive_mode"], name
            assert emu.servos[i].get(dxt.HOMING_OFFSET, 4, signed=True) == src["homing_offset"]
    # every joint where its range says the shafts are: 0 rad, grippers half open
    assert state.position[ROTARY] == pytest.approx(0.0, abs=SCALE)
    assert state.position[~ROTARY] == pytest.approx(0.5, abs=1e-3)


def test_a_reversed_joint_reads_the_other_way_round(koch_calibration):
    with Emulator("dynamixel", IDS) as emu:
        d = make_driver("dynamixel", emu.port, koch_calibration, watchdog_ms=0)
        d.open()
        try:
            before = d.read().position
            _shafts(emu, +100)
            after = d.read().position
        finally:
            d.close()
    moved = after - before
    sign = np.where(REVERSED, -1.0, 1.0)
    assert moved[ROTARY] == pytest.approx((sign * 100 * SCALE)[ROTARY], abs=1e-9)
    span = LEROBOT_KOCH["gripper"]["range_max"] - LEROBOT_KOCH["gripper"]["range_min"]
    assert moved[~ROTARY] == pytest.approx(-100 / span)  # the gripper is reversed too


def test_a_reversed_joint_is_driven_the_other_way_round(koch_calibration):
    step = 0.2  # rad, each rotary joint; the gripper 0.1 more open
    with Emulator("dynamixel", IDS) as emu:
        d = make_driver("dynamixel", emu.port, koch_calibration, watchdog_ms=0)
        d.open()
        try:
            d.torque(True)
            start = {i: emu.servos[i].actual for i in IDS}
            here = d.read().position
            d.write(here + np.where(ROTARY, step, 0.1))
            d.read()  # a round trip: the emulator has carried out the write before it
            with emu.lock:
                goal_shaft = {i: emu.servos[i].target for i in IDS}
        finally:
            d.close()
    for k, (i, name) in enumerate(zip(IDS, NAMES)):
        want = step / SCALE if ROTARY[k] else 0.1 * 1000
        sign = -1 if REVERSED[k] else 1
        # the shaft is sent the other way for a reversed joint, the same amount
        assert goal_shaft[i] - start[i] == pytest.approx(sign * want, abs=1.0), name


def test_the_cli_imports_a_koch_calibration_for_the_koch_config(tmp_path):
    lerobot = tmp_path / "koch_follower.json"
    lerobot.write_text(json.dumps(LEROBOT_KOCH))
    config = copy_config(tmp_path, "koch.toml")
    out = run_cli("--config", str(config), "--import-lerobot", str(lerobot))
    assert out.returncode == 0, out.stderr
    cal = load_calibration(tmp_path / "koch.calibration.json")
    assert cal.protocol == "dynamixel" and list(cal.joints) == list(NAMES)
    for name, j in cal.joints.items():
        src = LEROBOT_KOCH[name]
        assert (j.id, j.drive_mode, j.homing_offset, j.range_min, j.range_max) == (
            src["id"], src["drive_mode"], src["homing_offset"], src["range_min"],
            src["range_max"],
        )  # fmt: skip
