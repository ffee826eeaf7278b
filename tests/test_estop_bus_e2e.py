"""An e-stop onto a bus that is gone, end to end: config/so101.toml run by `robotd run` on
the bus emulator (a real pty, in this process), an episode under way, then the emulator
closes its end (as an adapter unplugged: every write gets EIO). `robotctl estop` must not
claim the robot stopped: it exits 2 saying the safe command was not written, through the
daemon and, with the main process stopped, through lane.sock alike."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.emulators.bus import Emulator
from drivers.servo.calibration import save_calibration
from robotd.config import load_config
from robotd.operator.client import ControlClient
from robotd.runtime.emulate import emulated_calibration
from tests.daemon_util import REPO, Daemon


@pytest.fixture
def moving(tmp_path: Path) -> Iterator[tuple[Daemon, Emulator]]:
    """The SO-101 config on an emulator, its episode started (torque on, the arm moving)."""
    config = REPO / "config" / "so101.toml"
    cfg = load_config(config)
    calibration = tmp_path / "calibration.json"
    save_calibration(emulated_calibration(cfg), calibration)
    emu = Emulator("feetech", cfg.joints.options["ids"])
    emu.start()
    sets = [f'joints.options.port="{emu.port}"', f'joints.options.calibration="{calibration}"']
    sets += [f'cameras.{name}.options.fallback="pattern"' for name in cfg.cameras]
    sets += ["control.hz=10", "joints.options.timeout_ms=40", "joints.options.budget_ms=80"]
    d = Daemon(tmp_path, "--config", str(config), *(a for s in sets for a in ("--set", s)))
    try:
        d.wait_line(r"operator socket", timeout=60)
        client = ControlClient(d.control_endpoint, timeout_s=15)
        try:
            for cmd in ("clear_fault", "start"):
                assert client.request(cmd)["ok"], cmd
        finally:
            client.close()
        d.wait_line(r"episode_start", timeout=30)
        yield d, emu
    finally:
        emu.stop()
        d.signal()
        d.wait_exit()


def _robotctl_estop(d: Daemon, reason: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "robotd.operator.robotctl", "estop", "--reason", reason]
    env = {**os.environ, "ROBOTD_ENDPOINT": d.control_endpoint}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_an_estop_onto_a_bus_that_is_gone_is_not_claimed(moving) -> None:
    d, emu = moving
    emu.stop()  # the far end of the pty closes: every read and write now fails
    d.wait_line(r"driver_error", timeout=30)
    out = _robotctl_estop(d, "bus gone")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "not written" in out.stderr and "may NOT be stopped" in out.stderr, out.stderr
    # the main process stopped: robotctl goes to lane.sock, which says the same
    assert d.proc is not None
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        out = _robotctl_estop(d, "bus gone, main stopped")
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "via lane.sock" in out.stderr and "not written" in out.stderr, out.stderr
