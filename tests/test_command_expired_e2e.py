"""A command that would move the robot again, arriving after its client stopped waiting,
is not carried out: the daemon's main process stopped (SIGSTOP) while an operator's
`start` waited in its socket; robotctl said nobody answered; once the process runs again
the start reaches the control lane, which refuses it (`expired`) instead of starting an
episode nobody expects any more. Real daemon on the sim, real sockets."""

from __future__ import annotations

import os
import signal

import pytest

from robotd.control.episode import CommandRefused
from robotd.control.gate import undo_allowed
from robotd.operator.client import ControlClient, Unreachable
from robotd.operator.requests import RequestError, expires_ns, parse_request
from robotd.wire import packb
from tests.daemon_util import Daemon, lane_pid

DEADLINE_S = 30.0  # generous: a loaded 2-core machine


def test_a_start_its_client_gave_up_on_does_not_start(tmp_path) -> None:
    # the lane's own watch on a silent main process stays out of it (15 s)
    d = Daemon(tmp_path, "--set", "control.main_silent_s=15")
    d.wait_line(r"episode_start", DEADLINE_S * 2)
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        assert c.request("stop")["ok"]
        assert c.request("reset_done")["result"]["state"] == "IDLE"
        impatient = ControlClient(d.control_endpoint, timeout_s=1)
        assert impatient.request("status")["ok"]  # connected: its start will be sent
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(Unreachable, match=r"no answer|no reply|within"):
                impatient.request("start")  # sent; waits its 1 s: nobody answers
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
            impatient.close()
        refused = d.wait_line(r"operator: start failed: .*after its client stopped waiting",
                              DEADLINE_S)  # fmt: skip
        assert "not carried out" in refused, refused
        assert c.request("status")["result"]["state"] == "IDLE"
        # one sent now, and waited for, does start
        assert c.request("start")["result"]["state"] == "RUNNING"
    finally:
        c.close()
    d.signal(signal.SIGTERM)
    assert d.wait_exit() == 0, "".join(d.log[-30:])


def test_a_start_the_daemon_answered_timeout_does_not_start_later(tmp_path) -> None:
    """The client waits 15 s, the daemon only 5 for its lane (then answers `timeout`): the
    start expires with the daemon's answer, not with the client's longer wait."""
    d = Daemon(tmp_path, "--set", 'robot.start="idle"')
    d.wait_line(r"operator socket", DEADLINE_S * 2)
    c = ControlClient(d.control_endpoint, timeout_s=15)
    lane = lane_pid(d)
    try:
        os.kill(lane, signal.SIGSTOP)
        try:
            reply = c.request("start")
        finally:
            os.kill(lane, signal.SIGCONT)
        assert not reply["ok"] and reply["error"]["code"] == "timeout", reply
        d.wait_line(
            r"the control lane answered the start given up on: refused \(expired: "
            r"start reached the control lane",
            DEADLINE_S,
        )
        assert c.request("status")["result"]["state"] == "IDLE"
    finally:
        c.close()
    d.signal(signal.SIGTERM)
    assert d.wait_exit() == 0, "".join(d.log[-30:])


def test_the_gate_refuses_late_and_superseded_commands_only() -> None:
    undo_allowed("start", 100, 50, 200, 150)  # after the e-stop, in time
    undo_allowed("start", 0, 50, 0, 10**12)  # nothing known: not judged
    with pytest.raises(CommandRefused) as late:
        undo_allowed("start", 100, 0, 200, 201)
    assert late.value.code == "expired"
    with pytest.raises(CommandRefused) as superseded:
        undo_allowed("clear_fault", 50, 50, 200, 150)
    assert superseded.value.code == "superseded"


def test_wait_s_is_checked_and_sets_when_the_client_gives_up() -> None:
    req = parse_request(packb({"id": 1, "cmd": "start", "sent_ns": 10**9, "wait_s": 2.5}))
    assert req.wait_s == 2.5 and expires_ns(req) == 10**9 + 2_500_000_000
    req = parse_request(packb({"id": 2, "cmd": "start", "sent_ns": 10**9}))
    assert expires_ns(req) == 10**9 + 10_000_000_000  # a client that does not say: 10 s
    for bad in (0, -1, float("nan"), float("inf"), 1e9, "1", True):
        with pytest.raises(RequestError, match="field 'wait_s' must be a number of seconds"):
            parse_request(packb({"id": 3, "cmd": "start", "wait_s": bad}))
