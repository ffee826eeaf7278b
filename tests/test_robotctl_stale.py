"""`robotctl estop` against a dead daemon whose socket files were left behind: it must
say that it reached nothing (exit 2, EXIT_UNREACHABLE) and never claim the e-stop was
sent. The case without socket files is tests/test_robotctl.py."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from robotd.operator.robotctl import EXIT_UNREACHABLE
from tests.daemon_util import Daemon, processes_mentioning, wait_until
from tests.robotctl_util import robotctl

STALE = ("control.sock", "lane.sock")


def assert_estop_reaches_nothing(run_dir: Path) -> None:
    out, _ = robotctl(
        "estop", "--timeout", "2", env={"ROBOTD_ENDPOINT": f"ipc://{run_dir}/control.sock"}
    )
    said = out.stdout + out.stderr
    assert out.returncode == EXIT_UNREACHABLE, said
    for name in STALE:  # both doors were tried and each was found dead
        assert f"no daemon listens on {run_dir / name} (a stale socket file)" in said, said
    assert "FAULT" not in said and "sent" not in said and "Traceback" not in said


def test_estop_with_stale_socket_files_says_it_reached_nothing(tmp_path):
    for name in STALE:  # bound then closed: the file stays and nobody listens
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(tmp_path / name))
        s.close()
    assert_estop_reaches_nothing(tmp_path)


def test_estop_against_a_daemon_killed_with_all_its_children(tmp_path):
    d = Daemon(tmp_path, "--set", 'robot.start="latched"')
    d.wait_line(r"operator socket")
    os.killpg(d.proc.pid, signal.SIGKILL)  # main, lane and worker at once: nobody cleans up
    d.wait_exit()
    wait_until(lambda: not processes_mentioning(str(d.dir)), 30, "the daemon's children to die")
    assert all((d.dir / name).exists() for name in STALE)  # what it left behind
    assert_estop_reaches_nothing(d.dir)
