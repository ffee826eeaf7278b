"""bench/serial.py on a robot's own config: the config's arm on its emulator (`--config F
--emulate`), and the hardware-in-the-loop path (`--config F [--port P]`) against an
emulator standing in for the real bus, with the arm's own joint names and calibration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from drivers.emulators.launch import start_emulator
from drivers.servo.calibration import save_calibration
from robotd.config import load_config
from robotd.runtime.emulate import emulated_calibration
from tests.daemon_util import REPO

KEYS = {"protocol", "servos", "baud", "rtt_p50_ms", "rtt_p99_ms", "floor_ms", "rate_hz",
        "cpu_pct", "raw_p50_ms", "ratio_vs_raw", "target_ms", "fast_sync_read",
        "failed_reads"}  # fmt: skip


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "bench/serial.py", "--seconds", "0.5", "--json", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def result(out: subprocess.CompletedProcess[str]) -> dict:
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.splitlines()[-1])
    assert set(r) >= KEYS, KEYS - set(r)
    assert r["cycles"] > 0 and r["rtt_p50_ms"] > 0 and r["floor_ms"] > 0
    return r


@pytest.mark.parametrize(("arm", "protocol"), [("so101", "feetech"), ("koch", "dynamixel")])
def test_a_config_on_its_emulator(arm, protocol):
    r = result(bench("--config", f"config/{arm}.toml", "--emulate"))
    assert (r["protocol"], r["servos"], r["baud"]) == (protocol, 6, 1_000_000)
    assert r["raw_p50_ms"] is not None  # our emulator: the raw exchange is measured too


def _arm_beside(tmp_path: Path, calibrated: bool) -> Path:
    """config/so101.toml copied, with (or without) a calibration file of its own beside it."""
    config = tmp_path / "so101.toml"
    config.write_text((REPO / "config" / "so101.toml").read_text())
    if calibrated:
        cal = emulated_calibration(load_config(config))
        save_calibration(cal, tmp_path / "so101.calibration.json")
    return config


def test_hardware_in_the_loop_takes_the_arms_config(tmp_path):
    config = _arm_beside(tmp_path, calibrated=True)
    with start_emulator("feetech", range(1, 7)) as bus:  # standing in for the arm
        r = result(bench("--config", str(config), "--port", bus.port))
    assert (r["protocol"], r["servos"]) == ("feetech", 6)
    assert r["raw_p50_ms"] is None  # real servos: only the driver is measured


def test_hardware_in_the_loop_without_a_calibration_says_how_to_make_one(tmp_path):
    config = _arm_beside(tmp_path, calibrated=False)
    with start_emulator("feetech", range(1, 7)) as bus:
        out = bench("--config", str(config), "--port", bus.port)
    assert out.returncode == 2
    assert f"no calibration at {tmp_path / 'so101.calibration.json'}" in out.stderr
    assert "robotd calibrate" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port", "/dev/ttyUSB0"], "--port needs --config"),
        (["--config", "config/koch.toml", "--emulate", "feetech"], "drives 'dynamixel'"),
        (["--config", "config/so101.toml", "--servos", "3"], "the config names them"),
        (["--config", "config/sim.toml"], "joints.driver is 'sim'"),
    ],
)
def test_what_the_bench_refuses(args, says):
    out = bench(*args)
    assert out.returncode == 2 and says in out.stderr, out.stderr
