"""A daemon whose main process is killed leaves its control lane holding the robot (for
control.orphan_s, then its e-stop category): the lane keeps the run directory's lock, so a
daemon started meanwhile (systemd's restart) waits for it instead of opening the bus and
lane.sock beside it, and an e-stop sent in that window reaches the lane that holds the robot
(real processes, real sockets)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from robotd.runtime.rundir import lock_holder
from tests.daemon_util import REPO, Daemon, wait_until

ORPHAN = ("--set", "control.orphan_s=8", "--set", 'robot.start="latched"')


def robotctl(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "robotd.operator.robotctl", "--endpoint", d.control_endpoint,
         *args],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_restart_waits_for_the_orphaned_lane_and_its_estop_reaches_that_lane(tmp_path):
    first = Daemon(tmp_path, *ORPHAN)
    first.wait_line(r"operator socket")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=30)
    second = Daemon(tmp_path, *ORPHAN)
    try:
        second.wait_line(r"the control lane of robotd pid \d+, which is gone, still holds")
        assert lock_holder(second.dir) == first.proc.pid  # the lane's lock, as it was taken
        said = robotctl(second, "status")
        assert said.returncode == 2, said
        assert f"robotd pid {first.proc.pid} is gone, and its control lane" in said.stderr
        stopped = robotctl(second, "estop", "--reason", "while it holds")
        assert stopped.returncode == 0, stopped
        assert "via      lane.sock" in stopped.stdout, stopped.stdout
        assert "e-stop 'while it holds'" in stopped.stdout, stopped.stdout
        second.wait_line(r"operator socket", timeout=60)  # once the orphaned lane let go
        status = robotctl(second, "status")
        assert status.returncode == 0 and "started latched" in status.stdout, status
    finally:
        second.signal()
    assert second.wait_exit() == 0
    wait_until(lambda: lock_holder(tmp_path / "run") is None, 30, "the run directory's lock")
