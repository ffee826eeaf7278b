"""The run directory going bad under a running daemon (real daemon, real filesystems).

Removed mid-episode (or only its pid file, which keeps a second daemon off the robot): its
sockets go with it, so nobody new could reach the robot (not even
`robotctl estop` through lane.sock); the daemon notices, says so, e-stops the robot through
the lane connection it still holds and stops (exit 1: a restart makes them again, latched).

Made read-only mid-run (a read-only bind mount over it: root ignores permission bits; skipped
where mounting is not permitted, unmounted after): the sockets still serve, and the daemon's
stop leaves the files it cannot remove behind, saying so, instead of crashing on them; a
trace under it records nothing and status says so."""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from robotd.operator.client import ControlClient
from tests.daemon_util import Daemon, wait_until

DEADLINE_S = 30.0  # generous: a loaded 2-core machine


def test_a_removed_run_directory_estops_the_robot_and_stops_saying_why(tmp_path):
    d = Daemon(tmp_path)
    d.wait_line(r"episode_start", DEADLINE_S)
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        wait_until(lambda: c.request("status")["result"]["step"] >= 10, DEADLINE_S, "steps")
    finally:
        c.close()
    shutil.rmtree(d.dir)
    d.wait_line(r"CRITICAL robotd: run directory .*: lane\.sock \(gone\), robotd\.pid "
                r"\(gone\), control\.sock \(gone\), telemetry\.sock \(gone\): operators "
                r"can no longer reach this daemon", DEADLINE_S)
    d.wait_line(r"fault \{'cause': 'estop', 'detail': 'run directory lost: lane\.sock",
                DEADLINE_S)
    d.wait_line(r"torque_off", DEADLINE_S)  # category 1: the controlled stop, then off
    assert d.wait_exit() == 1
    assert d.result()["state"] == "FAULT", d.result()
    assert "Traceback" not in "".join(d.log), "".join(d.log[-30:])


def test_a_removed_pid_file_estops_and_stops_before_a_second_daemon_can_start(tmp_path):
    d = Daemon(tmp_path, "--set", 'robot.start="idle"', "--set", "safety.estop_category=0")
    d.wait_line(r"operator socket", DEADLINE_S)
    (d.dir / "robotd.pid").unlink()
    d.wait_line(r"CRITICAL robotd: run directory .*: robotd\.pid \(gone\): a second daemon "
                r"could start on it beside this one: e-stopping the robot", DEADLINE_S)
    assert d.wait_exit() == 1
    assert d.result()["state"] == "FAULT", d.result()
    # a second daemon may have bound the same names meanwhile: nothing there is removed
    left = {p.name for p in d.dir.iterdir()}
    assert {"control.sock", "telemetry.sock", "lane.sock"} <= left, left


@pytest.fixture
def read_only_later(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A directory, and the commands that make it read-only (a bind mount onto itself,
    remounted ro), checked to work here first; unmounted after."""
    run = tmp_path / "run"
    run.mkdir(mode=0o750)
    ro = [["mount", "--bind", str(run), str(run)], ["mount", "-o", "remount,bind,ro", str(run)]]
    p = subprocess.run(ro[0], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot bind-mount a directory read-only (needs root): {p.stderr.strip()}")
    subprocess.run(["umount", str(run)], check=True)
    try:
        yield run, ro
    finally:
        while subprocess.run(["umount", str(run)], capture_output=True).returncode == 0:
            pass  # every mount this test made over it


def test_a_run_directory_made_read_only_still_serves_and_stops_cleanly(read_only_later, tmp_path):
    run, ro = read_only_later
    d = Daemon(tmp_path, "--set", 'robot.start="idle"', "--set", f'trace.dir="{run}/traces"')
    d.wait_line(r"operator socket", DEADLINE_S)
    for cmd in ro:
        subprocess.run(cmd, check=True)
    c = ControlClient(d.control_endpoint, timeout_s=15)  # a new client, on the ro directory
    try:
        assert c.request("start")["result"]["state"] == "RUNNING"
        wait_until(lambda: c.request("status")["result"]["step"] >= 10, DEADLINE_S, "steps")
        trace = c.request("status")["result"]["trace"]  # its episode's file cannot open
        assert trace["recording"] is False and "Read-only" in trace["refused"]["error"], trace
    finally:
        c.close()
    d.signal(signal.SIGTERM)
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    log = "".join(d.wait_eof())
    assert "Traceback" not in log, log[-3000:]
    assert f"cannot remove {run}/control.sock: Read-only file system: left behind" in log
    assert f"cannot remove {run}/lane.sock: Read-only file system: left behind" in log
    assert "trace: cannot remove .reserve: [Errno 30] Read-only file system" in log
    assert "operators can no longer reach" not in log  # the sockets are all there
