"""A whole episode of a real arm's config on this machine: `robotd run --config
config/so101.toml --emulate`: the Feetech bus emulator on a pty, the cameras on their test
pattern, the Wave policy on the local worker; clear_fault and start through robotctl."""

from __future__ import annotations

import subprocess
import sys
import time

from robotd.operator.robotctl import ControlClient
from tests.daemon_util import REPO, Daemon, processes_mentioning, wait_until


def robotctl(endpoint: str, command: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "robotd.operator.robotctl", command, "--endpoint", endpoint,
         "--timeout", "15"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_so101_on_the_emulator_runs_an_episode_of_wave(tmp_path):
    d = Daemon(tmp_path, "--config", "config/so101.toml", "--emulate")
    try:
        d.wait_line(r"policy robotd\.demo:Wave at", timeout=60)
        d.wait_line(r"operator socket", timeout=30)
        log = "".join(d.log)
        assert "serving a test pattern instead" in log  # no USB camera here
        client = ControlClient(d.control_endpoint, timeout_s=15)
        status = client.request("status")["result"]
        assert status["state"] == "FAULT" and status["fault"]["cause"] == "startup"  # latched
        robotctl(d.control_endpoint, "clear_fault")
        robotctl(d.control_endpoint, "start")
        d.wait_line(r"episode_start", timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = client.request("stats")["result"]
            if stats.get("chunks", 0) >= 5:
                break
            time.sleep(0.2)  # polling a counter that has no event to wait on
        assert stats["chunks"] >= 5 and stats["acts"] >= 5
        assert stats["interventions"] == 0  # Wave stays inside the limits and speeds
        robotctl(d.control_endpoint, "stop")
        d.wait_line(r"episode_end", timeout=30)
        client.close()
    finally:
        d.signal()
        code = d.wait_exit()
    assert code == 0, "".join(d.log[-30:])
    summary = d.result()
    assert summary["episodes"] == 1 and summary["chunks"] >= 5
    # the emulator went with the daemon
    wait_until(lambda: not processes_mentioning("drivers.emulators"), 10, "the emulator to exit")
