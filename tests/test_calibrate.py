"""`robotd calibrate`: importing LeRobot's calibration files (written here from their
documented format) and the walk-through against the bus emulator."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from drivers.base import DriverContext, build_joints
from drivers.emulators.bus import Emulator
from drivers.feetech import table as ftt
from drivers.servo.calibration import CalibrationError, load_calibration
from drivers.servo.lerobot import import_lerobot
from robotd.operator import calibrate
from tests.daemon_util import REPO
from tests.servo_util import IDS, NAMES

# LeRobot's format: one object per motor name, raw ticks (homing offset as written to the
# servo, range in the positions it then reports)
KEYS = ("id", "drive_mode", "homing_offset", "range_min", "range_max")
LEROBOT_SO101 = {
    name: dict(zip(KEYS, values))
    for name, values in {
        "shoulder_pan": (1, 0, -1470, 758, 3292),
        "shoulder_lift": (2, 0, 157, 812, 3223),
        "elbow_flex": (3, 0, 1105, 860, 3096),
        "wrist_flex": (4, 0, -2019, 826, 3130),
        "wrist_roll": (5, 0, -989, 0, 4095),
        "gripper": (6, 0, 1413, 2031, 3490),
    }.items()
}


def _gripper(**change: object) -> str:
    return json.dumps({**LEROBOT_SO101, "gripper": {**LEROBOT_SO101["gripper"], **change}})


def copy_config(tmp_path: Path, name: str, port: str = "/dev/null") -> Path:
    text = (REPO / "config" / name).read_text()
    default_port = "/dev/ttyACM0" if "feetech" in text else "/dev/ttyUSB0"
    path = tmp_path / name
    path.write_text(text.replace(f'port = "{default_port}"', f'port = "{port}"'))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "robotd", "calibrate", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_import_lerobot_writes_the_calibration_next_to_the_config(tmp_path):
    lerobot = tmp_path / "my_follower.json"
    lerobot.write_text(json.dumps({**LEROBOT_SO101, "unknown_extra": {"id": 9, "drive_mode": 0,
                       "homing_offset": 0, "range_min": 0, "range_max": 1}}))  # fmt: skip
    config = copy_config(tmp_path, "so101.toml")
    out = run_cli("--config", str(config), "--import-lerobot", str(lerobot))
    assert out.returncode == 0, out.stderr
    cal = load_calibration(tmp_path / "so101.calibration.json")
    assert cal.protocol == "feetech" and list(cal.joints) == list(NAMES)
    for name, j in cal.joints.items():
        src = LEROBOT_SO101[name]
        assert (j.id, j.homing_offset, j.range_min, j.range_max) == (
            src["id"], src["homing_offset"], src["range_min"], src["range_max"])  # fmt: skip
    assert "LeRobot calibration" in cal.source
    # again: the previous file is kept
    assert run_cli("--config", str(config), "--import-lerobot", str(lerobot)).returncode == 0
    assert (tmp_path / "so101.calibration.json.bak").exists()


def test_calibrate_takes_set_overrides_as_run_does(tmp_path):
    lerobot = tmp_path / "my_follower.json"
    lerobot.write_text(json.dumps(LEROBOT_SO101))
    config = copy_config(tmp_path, "so101.toml")
    out = run_cli("--config", str(config), "--import-lerobot", str(lerobot),
                  "--set", 'joints.options.calibration="arm2.calibration.json"')
    assert out.returncode == 0, out.stderr
    assert load_calibration(tmp_path / "arm2.calibration.json").protocol == "feetech"
    assert not (tmp_path / "so101.calibration.json").exists()
    bad = run_cli("--config", str(config), "--import-lerobot", str(lerobot),
                  "--set", "joints.options.baud=true")
    assert bad.returncode != 0 and "--set joints.options.baud" in bad.stderr, bad.stderr


def test_an_imported_calibration_drives_the_arm(tmp_path):
    lerobot = tmp_path / "follower.json"
    lerobot.write_text(json.dumps(LEROBOT_SO101))
    cal = import_lerobot(lerobot, "feetech", NAMES)
    path = tmp_path / "cal.json"
    from drivers.servo.calibration import save_calibration

    save_calibration(cal, path)
    with Emulator("feetech", IDS) as emu:
        opts = {"port": emu.port, "ids": list(IDS), "calibration": str(path),
                "grippers": ["gripper"], "timeout_ms": 50.0, "budget_ms": 400.0}  # fmt: skip
        d = build_joints("feetech", NAMES, opts, DriverContext())
        d.open()
        try:
            for i, name in zip(IDS, NAMES):  # the offsets went into the servos
                raw = emu.servos[i].get(ftt.HOMING_OFFSET, 2)
                assert ftt.decode_sign_magnitude(raw, 11) == LEROBOT_SO101[name]["homing_offset"]
            state = d.read()
        finally:
            d.close()
    # the shafts sit at 2048: the servo reports 2048 − offset, zero is mid-range
    pan = LEROBOT_SO101["shoulder_pan"]
    mid = (pan["range_min"] + pan["range_max"]) / 2
    assert state.position[0] == pytest.approx(
        (2048 - pan["homing_offset"] - mid) * 2 * 3.14159265 / 4096
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not a LeRobot calibration"),
        (json.dumps({"shoulder_pan": {"id": 1}}), "not a LeRobot calibration"),
        (json.dumps({k: v for k, v in LEROBOT_SO101.items() if k != "gripper"}), "no motor"),
        (_gripper(range_min=4000), "range_min"),
        (_gripper(id="6"), "not a LeRobot"),
        (json.dumps([1, 2]), "not a LeRobot calibration"),
    ],
)  # fmt: skip
def test_bad_lerobot_files_are_refused_by_name(tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(CalibrationError, match=message):
        import_lerobot(bad, "feetech", NAMES)


def test_the_cli_refuses_a_file_of_other_servos(tmp_path):
    lerobot = tmp_path / "koch.json"
    lerobot.write_text(
        json.dumps({**LEROBOT_SO101, "gripper": {**LEROBOT_SO101["gripper"], "id": 7}})
    )
    out = run_cli(
        "--config", str(copy_config(tmp_path, "koch.toml")), "--import-lerobot", str(lerobot)
    )
    assert out.returncode == 2
    assert "'gripper' is servo 7 there, 6 in" in out.stderr
    assert not (tmp_path / "koch.calibration.json").exists()


# the shipped configs' followers (config/koch.toml, config/so101.toml: joints.options.models)
FOLLOWER = {"dynamixel": ["xl430-w250"] * 2 + ["xl330-m288"] * 4, "feetech": "sts3215"}


class Screen:
    """What the walk-through prints, waited on by the test (no sleeps as synchronisation)."""

    def __init__(self) -> None:
        self.text = ""
        self.cond = threading.Condition()

    def write(self, s: str) -> int:
        with self.cond:
            self.text += s
            self.cond.notify_all()
        return len(s)

    def flush(self) -> None:
        pass

    def wait_for(self, needle: str, after: int = 0, timeout: float = 30.0) -> int:
        with self.cond:
            ok = self.cond.wait_for(lambda: needle in self.text[after:], timeout)
            assert ok, f"no {needle!r} on the screen:\n{self.text[-2000:]}"
            return self.text.index(needle, after) + len(needle)


@pytest.mark.parametrize("protocol", ["dynamixel", "feetech"])
def test_the_walk_through_sets_homing_offsets_and_records_ranges(tmp_path, protocol):
    mid = {i: 2100 + 37 * i for i in IDS}  # where the operator puts the middle pose
    ends = {i: (mid[i] - 700 - i, mid[i] + 650 + i) for i in IDS}
    with Emulator(protocol, IDS, model=FOLLOWER[protocol]) as emu:
        config = copy_config(
            tmp_path, "koch.toml" if protocol == "dynamixel" else "so101.toml", emu.port
        )
        r, w = os.pipe()
        keys, screen = os.fdopen(w, "w"), Screen()
        result: list[int] = []
        worker = threading.Thread(
            target=lambda: result.append(
                calibrate.main(["--config", str(config)], stdin=os.fdopen(r), stdout=screen)
            )
        )

        def move(ident: int, ticks: float) -> None:
            with emu.lock:
                emu.servos[ident].actual = ticks

        def enter() -> None:
            keys.write("\n")
            keys.flush()

        for i in IDS:
            move(i, mid[i])
        worker.start()
        at = screen.wait_for("Step 1/2")
        enter()
        at = screen.wait_for("Step 2/2", at)
        for i, name in zip(IDS, NAMES):
            at = screen.wait_for(f"Move {name}", at)
            for end in ends[i]:
                move(i, end)
                # the live readout shows it once the next read has seen it
                present = end + (1 if protocol == "dynamixel" else -1) * offset(protocol, mid[i])
                at = screen.wait_for(f"now {round(present):>6}", at)
            enter()
        worker.join(30)
        keys.close()
    assert result == [0], screen.text[-2000:]
    arm = "koch" if protocol == "dynamixel" else "so101"
    cal = load_calibration(tmp_path / f"{arm}.calibration.json")
    for i, name in zip(IDS, NAMES):
        j = cal.joints[name]
        off = offset(protocol, mid[i])
        sign = 1 if protocol == "dynamixel" else -1
        assert j.homing_offset == off
        assert (j.range_min, j.range_max) == (ends[i][0] + sign * off, ends[i][1] + sign * off)
        # the middle pose reads a half turn now
        assert mid[i] + sign * off == 2047


def offset(protocol: str, actual: int) -> int:
    return 2047 - actual if protocol == "dynamixel" else actual - 2047


def test_another_arm_on_the_port_is_named_and_nothing_is_written(tmp_path, capsys):
    """The Koch leader (xl330-m077 throughout) where the follower's config points: its
    ranges would be saved as the follower's. Refused after reads alone."""
    with Emulator("dynamixel", IDS, model="xl330-m077") as emu:
        config = copy_config(tmp_path, "koch.toml", emu.port)
        code = calibrate.main(["--config", str(config)], stdin=io.StringIO(), stdout=Screen())
        sent = {inst for _, inst in emu.received}
    assert code == 2 and sent <= {0x01, 0x02}, emu.received  # pings and reads only
    err = capsys.readouterr().err
    assert "joint 'shoulder_pan' (servo 1) is a xl330-m077, joints.options.models says " in err
    assert "xl430-w250: another arm on this port, or a servo swapped? Nothing written" in err
    assert not (tmp_path / "koch.calibration.json").exists()


def test_a_joint_that_was_not_moved_is_named(tmp_path):
    with Emulator("feetech", IDS) as emu:
        config = copy_config(tmp_path, "so101.toml", emu.port)
        r, w = os.pipe()
        os.write(w, b"\n" * 3)  # Enter at once, every time: nothing moved
        os.close(w)
        screen = Screen()
        code = calibrate.main(["--config", str(config)], stdin=os.fdopen(r), stdout=screen)
    assert code == 2
    assert not (tmp_path / "so101.calibration.json").exists()
