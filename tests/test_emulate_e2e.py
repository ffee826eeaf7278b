"""A whole episode of a real arm's config on this machine: `robotd run --config
config/so101.toml --emulate` (and config/koch.toml): the arm's bus emulator (Feetech,
Dynamixel) on a pty, the cameras on their test pattern, the Wave policy on the local
worker; clear_fault and start through robotctl."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from robotd.operator.robotctl import ControlClient
from tests.daemon_util import REPO, Daemon, wait_until


def children(pid: int) -> dict[int, str]:
    """The command lines of `pid`'s live children, by pid."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        # the fields after the command name (which may hold spaces): state, ppid, ...
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if ppid == str(pid) and state != "Z":
            found[int(proc.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def alive(pid: int) -> bool:
    """`pid` runs (a zombie has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def robotctl(endpoint: str, command: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "robotd.operator.robotctl", command, "--endpoint", endpoint,
         "--timeout", "15"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize(("arm", "protocol"), [("so101", "feetech"), ("koch", "dynamixel")])
def test_an_arm_on_the_emulator_runs_an_episode_of_wave(tmp_path, arm, protocol):
    d = Daemon(tmp_path, "--config", f"config/{arm}.toml", "--emulate")
    try:
        d.wait_line(r"policy robotd\.demo:Wave at", timeout=60)
        d.wait_line(r"operator socket", timeout=30)
        log = "".join(d.log)
        assert "serving a test pattern instead" in log, log[-3000:]  # no USB camera here
        # the daemon started the arm's own emulator, not the other family's
        emulators = [
            pid for pid, c in children(d.proc.pid).items() if f"drivers.emulators {protocol} " in c
        ]
        assert len(emulators) == 1, children(d.proc.pid)
        client = ControlClient(d.control_endpoint, timeout_s=15)
        status = client.request("status")["result"]
        latched = status["state"] == "FAULT" and status["fault"]["cause"] == "startup"
        assert latched, (status, "".join(d.log[-30:]))
        robotctl(d.control_endpoint, "clear_fault")
        robotctl(d.control_endpoint, "start")
        d.wait_line(r"episode_start", timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = client.request("stats")["result"]
            if stats.get("chunks", 0) >= 5:
                break
            time.sleep(0.2)  # polling a counter that has no event to wait on
        assert stats["chunks"] >= 5 and stats["acts"] >= 5, (stats, "".join(d.log[-30:]))
        # Wave stays inside the limits and speeds
        assert stats["interventions"] == 0, (stats, "".join(d.log[-30:]))
        robotctl(d.control_endpoint, "stop")
        d.wait_line(r"episode_end", timeout=30)
        client.close()
    finally:
        d.signal()
        code = d.wait_exit()
    assert code == 0, "".join(d.log[-30:])
    summary = d.result()
    assert summary["episodes"] == 1 and summary["chunks"] >= 5, summary
    # the emulator went with the daemon
    wait_until(lambda: not alive(emulators[0]), 10, "the emulator to exit")


def test_the_emulated_arm_reads_with_room_for_a_busy_machine_unless_the_config_says():
    """The emulator is a program on the same CPUs, not a servo: --emulate gives the tick's
    reads 10 ms a reply and 80 % of the tick in all, unless the config sets its own."""
    from robotd.config import load_config
    from robotd.runtime.emulate import start_emulation

    given = ["joints.options.timeout_ms=4", "joints.options.budget_ms=9"]
    keys = ("joints.options.timeout_ms", "joints.options.budget_ms")
    for sets, want in (([], ["timeout_ms=10.0", "budget_ms=26.67"]), (given, [])):
        extra, stop = start_emulation(load_config(REPO / "config" / "so101.toml", sets))
        try:
            timing = [e.removeprefix("joints.options.") for e in extra if e.split("=")[0] in keys]
            assert timing == want
            load_config(REPO / "config" / "so101.toml", [*sets, *extra])  # and it loads
        finally:
            stop()
