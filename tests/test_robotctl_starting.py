"""A daemon whose policy is still loading has no operator socket yet: robotctl and watch
say that a daemon is there and starting (not "no daemon"), and that an e-stop reaches its
control lane, which it does. Once the daemon is gone, "no daemon" again. A real daemon
whose real local worker never finishes loading; the run directory's lock as /proc/locks
shows it."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from rich.console import Console

from robotd.operator.client import starting
from robotd.operator.robotctl import EXIT_OK, EXIT_UNREACHABLE
from robotd.operator.view import Screen, line, render
from robotd.runtime.rundir import PID_FILE, lock_holder, lock_run_dir
from tests.daemon_util import Daemon
from tests.robotctl_util import robotctl

POLICY = "tests.hello_policies:NeverReady"


def test_the_lock_holder_is_read_without_taking_the_lock(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert lock_holder(run) is None  # no directory
    fd = lock_run_dir(run)
    try:
        assert lock_holder(run) == os.getpid()
        assert "is starting or stopping" in starting(run / "control.sock")
        assert "lane.sock" not in starting(run / "control.sock")  # no lane there
    finally:
        os.close(fd)
    assert (run / PID_FILE).exists() and lock_holder(run) is None  # a pid file left behind
    assert starting(run / "control.sock") == ""


def test_a_daemon_still_loading_its_policy_is_said_starting(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "--set", f'policy.serve="{POLICY}"', "--set", "policy.start_s=300")
    d.wait_line(r"waiting up to 300 s", 120)  # the lane ticks; the worker does not answer
    at = {"ROBOTD_ENDPOINT": d.control_endpoint}
    words = (
        f"robotd pid {d.proc.pid} is starting or stopping: its operator sockets open once its"
        " policy worker answers hello; an e-stop reaches its control lane meanwhile (lane.sock)"
    )
    out, _ = robotctl("status", env=at)
    assert out.returncode == EXIT_UNREACHABLE and words in out.stderr, out.stderr
    assert "no daemon" not in out.stderr
    seen, _ = robotctl("watch", "--seconds", "1", "--endpoint", d.control_endpoint)
    assert f"STARTING {words}" in seen.stdout and "NO DAEMON" not in seen.stdout, seen.stdout
    js, _ = robotctl("watch", "--json", "--seconds", "1", "--endpoint", d.control_endpoint)
    first = json.loads(js.stdout.splitlines()[0])
    assert first["error"]["code"] == "starting" and words in first["error"]["message"]
    stop, _ = robotctl("estop", "--reason", "while it loads", env=at)
    assert stop.returncode == EXIT_OK and "via      lane.sock" in stop.stdout, stop.stdout
    d.wait_line(r"fault \{'cause': 'estop', 'detail': 'while it loads'\}")
    d.signal()
    d.wait_exit(timeout=60)
    gone, _ = robotctl("status", env=at)
    assert gone.returncode == EXIT_UNREACHABLE and "no daemon" in gone.stderr, gone.stderr


def test_the_screen_says_starting_not_no_daemon() -> None:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render(Screen("ipc:///x/control.sock", starting="robotd pid 7 is starting")))
    text = console.export_text()
    assert "STARTING  robotd pid 7 is starting" in text and "NO DAEMON" not in text
    serving = Screen("e", msg={"state": {"state": "IDLE"}}, starting="robotd pid 7 is stopping")
    assert "NOT SERVING robotd pid 7 is stopping; " in line(serving)
