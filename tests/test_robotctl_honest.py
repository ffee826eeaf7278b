"""robotctl against a real daemon: an e-stop goes through whatever its reason (through
the main process and through lane.sock), escape codes in a reason never reach the
terminal (human output, watch) while --json keeps them exact, a command that got no reply
in time is said to possibly take effect (and does), the link is said readably."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

from robotd.operator.client import ControlClient
from robotd.operator.robotctl import EXIT_OK, EXIT_UNREACHABLE
from robotd.operator.robotctl_args import estop_reason
from tests.daemon_util import Daemon
from tests.robotctl_util import PtyWatch, client, latched_daemon, robotctl

UNDECODABLE = os.fsdecode(b"\xff stop now")  # what argv holds for bytes that are not UTF-8
NASTY = "\x1b]0;PWNED\x07\x1b[2J\x9b31m"
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


daemon = latched_daemon("honest")
__all__ = ["client"]  # a fixture used here


def _at(daemon: Daemon) -> dict[str, str]:
    return {"ROBOTD_ENDPOINT": daemon.control_endpoint}


def _clear(client: ControlClient) -> None:
    """No fault latched: the next e-stop is the fault's first cause, the one status shows."""
    client.request("clear_fault")
    assert client.request("status")["result"]["state"] == "IDLE"


def _fault(client: ControlClient) -> dict:
    state = client.request("status")["result"]
    assert state["state"] == "FAULT", state
    return state["fault"]


def _child(daemon: Daemon, module: str) -> int:
    """The pid of the daemon's child process running `module`."""
    pid = daemon.proc.pid
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        if module in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
            return int(child)
    raise AssertionError(f"no {module} child of {pid}")


def test_an_estop_goes_through_whatever_its_reason(daemon, client):
    _clear(client)
    out, _ = robotctl("estop", "--reason", UNDECODABLE, env=_at(daemon))
    assert out.returncode == EXIT_OK, out.stderr
    assert "e-stop: \ufffd stop now" in out.stdout
    assert _fault(client)["detail"] == "\ufffd stop now"
    long = "why " * 100  # 400 characters: over the daemon's 200
    _clear(client)
    out, _ = robotctl("estop", "--reason", long, env=_at(daemon))
    assert out.returncode == EXIT_OK, out.stderr
    assert _fault(client)["detail"] == estop_reason(long) and len(estop_reason(long)) == 200


def test_an_estop_through_lane_sock_goes_through_whatever_its_reason(daemon, client):
    _clear(client)
    reason = UNDECODABLE + " via the lane " * 30
    os.kill(daemon.proc.pid, signal.SIGSTOP)  # the main process does not answer
    try:
        out, _ = robotctl("estop", "--timeout", "1", "--reason", reason, env=_at(daemon))
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    assert out.returncode == EXIT_OK, out.stderr
    assert "via      lane.sock" in out.stdout  # the lane's own acknowledgement
    assert "e-stop: \ufffd stop now via the lane" in out.stdout
    clean = estop_reason(reason)
    daemon.wait_line(re.escape(f"fault {{'cause': 'estop', 'detail': {clean!r}}}"))


def test_escape_codes_from_the_wire_never_reach_the_terminal(daemon, client):
    _clear(client)
    out, _ = robotctl("estop", "--reason", NASTY, env=_at(daemon))
    assert out.returncode == EXIT_OK, out.stderr
    for said in (out, robotctl("status", env=_at(daemon))[0]):
        assert not CONTROL.search(said.stdout), repr(said.stdout)
        assert "e-stop: \\x1b]0;PWNED\\x07\\x1b[2J\\x9b31m" in said.stdout
    js, _ = robotctl("status", "--json", env=_at(daemon))
    assert json.loads(js.stdout)["fault"]["detail"] == NASTY  # --json: exact
    w = PtyWatch("--endpoint", daemon.control_endpoint)
    try:
        w.read_until(r"e-stop: \\x1b\]0;PWNED")
    finally:
        assert w.close() == 0
    assert b"\x1b]0;PWNED" not in w.raw and b"\x07" not in w.raw


def test_a_start_unanswered_in_time_is_not_carried_out_late(daemon, client):
    assert client.request("clear_fault")["result"]["state"] == "IDLE"
    episode = client.request("status")["result"]["episode"]
    lane = _child(daemon, "robotd.control.process")
    os.kill(lane, signal.SIGSTOP)  # the daemon takes the start; its lane answers late
    try:
        out, _ = robotctl("start", "--timeout", "1", env=_at(daemon))
    finally:
        os.kill(lane, signal.SIGCONT)
    assert out.returncode == EXIT_UNREACHABLE
    assert "not carried out if it reaches the control lane from now on" in out.stderr
    # the lane reached it after robotctl had said nobody answered: refused, not started
    daemon.wait_line(r"operator: start failed: .*after its client stopped waiting")
    st = client.request("status")["result"]
    assert st["state"] == "IDLE" and st["episode"] == episode, st


def test_status_says_the_link_readably(daemon):
    out, _ = robotctl("status", env=_at(daemon))
    link = next(line for line in out.stdout.splitlines() if line.startswith("link"))
    assert re.match(r"link     (up|connecting|gone) for [\d.]+ s, policy robotd\.demo:", link), link
    assert "link link" not in link and "reason" not in link and "reconnects 0" not in link
