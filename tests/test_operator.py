"""Operators drive a running daemon over the control socket; bad requests change nothing."""

# ruff: noqa: F811 (the fixtures imported from tests.operator_util are named as params)
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest
import zmq

from robotd import wire
from robotd.operator.robotctl import ControlClient
from tests.daemon_util import REPO
from tests.operator_util import client, daemon, latched  # noqa: F401 (fixtures)


def raw_request(endpoint: str, payload: bytes) -> dict:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(payload)
        assert sock.poll(5000), "no reply to a malformed request"
        return wire.unpackb(sock.recv())
    finally:
        sock.close()


def test_socket_is_group_only(daemon):
    mode = os.stat(daemon.dir / "control.sock").st_mode
    assert stat.S_IMODE(mode) == 0o660


def test_starts_latched_then_operator_enables_motion(tmp_path):
    """A daemon of its own: the module's has had its latch cleared by the other tests."""
    d = latched(tmp_path)
    client = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        _enables_motion_once_cleared(client)
    finally:
        client.close()
        d.signal()
    assert d.wait_exit() == 0


def _enables_motion_once_cleared(client: ControlClient) -> None:
    status = client.request("status")["result"]
    assert status["state"] == "FAULT" and status["fault"]["cause"] == "startup"
    refused = client.request("start")
    assert not refused["ok"] and refused["error"]["code"] == "bad_state"
    assert client.request("clear_fault")["result"]["state"] == "IDLE"
    assert client.request("start")["result"]["state"] == "RUNNING"
    assert client.request("stop")["result"]["state"] == "ENDED"
    assert client.request("reset_done")["result"]["state"] == "IDLE"


def test_estop_always_latches_and_cuts_torque(client):
    client.request("clear_fault")
    client.request("start")
    result = client.request("estop", {"reason": "test"})["result"]
    assert result["state"] == "FAULT" and result["fault"]["cause"] == "estop"
    assert result["torque"] is False  # category 0
    again = client.request("start")
    assert again["error"]["code"] == "bad_state"
    assert client.request("clear_fault")["result"]["state"] == "IDLE"


@pytest.mark.parametrize(
    "payload, code, words",
    [
        (b"\xc1garbage", "bad_request", "not a msgpack message"),
        (wire.packb([1, 2]), "bad_request", "must be a map"),
        (wire.packb({"id": 7}), "bad_request", "'cmd' must be a string"),
        (wire.packb({"id": 8, "cmd": "launch"}), "unknown_command", "unknown cmd 'launch'"),
        (
            wire.packb({"id": 9, "cmd": "status", "args": [1]}),
            "bad_request",
            "'args' must be a map",
        ),
        (
            wire.packb({"id": 10, "cmd": "verdict", "args": {"success": "yes"}}),
            "bad_args",
            "args.success must be bool",
        ),
        (
            wire.packb({"id": 11, "cmd": "start", "args": {"task": "x" * 2001}}),
            "bad_args",
            "at most 2000",
        ),
        (
            wire.packb({"id": 12, "cmd": "stop", "args": {"now": True}}),
            "bad_args",
            "unknown: now",
        ),
        (
            wire.packb({"id": 13, "cmd": "status", "args": {"a": {"b": {"c": [1]}}}}),
            "bad_request",
            "nested deeper than 4",
        ),
        (
            wire.packb({"id": 14, "cmd": "reset_done", "args": {"pad": "x" * 20_000}}),
            "too_large",
            "at most 16384 bytes",
        ),
        (wire.packb({"id": [1, 2], "cmd": "status"}), "bad_request", "'id' must be"),
    ],
)
def test_malformed_requests_get_an_error_and_change_nothing(daemon, client, payload, code, words):
    before = client.request("status")["result"]["state"]
    reply = raw_request(daemon.control_endpoint, payload)
    assert reply["ok"] is False
    assert reply["error"]["code"] == code and words in reply["error"]["message"]
    sent = wire.unpackb(payload) if payload[:1] != b"\xc1" else None
    if isinstance(sent, dict) and isinstance(sent.get("id"), int) and code != "too_large":
        assert reply["id"] == sent["id"]  # a client matches the error to its request
    assert client.request("status")["result"]["state"] == before


def test_verdict_stats_params(client):
    client.request("clear_fault")  # an episode of its own: this test runs alone too
    episode = client.request("start")["result"]["episode"]
    assert client.request("stop")["result"]["state"] == "ENDED"
    v = client.request("verdict", {"success": True, "notes": "clean grasp", "replace": True})
    assert v["result"]["success"] is True and v["result"]["notes"] == "clean grasp"
    assert v["result"]["episode"] == episode
    client.request("reset_done")
    stats = client.request("stats")["result"]
    assert stats["ticks"] > 0 and stats["verdicts"][-1]["notes"] == "clean grasp"
    assert client.request("params")["result"]["config"]["control"]["hz"] == 30


def test_a_second_verdict_is_refused_naming_the_first_unless_replaced(client):
    client.request("clear_fault")
    episode = client.request("start")["result"]["episode"]
    first = client.request("verdict", {"success": True, "notes": "clean grasp"})
    assert first["ok"] and first["result"]["episode"] == episode
    second = client.request("verdict", {"success": False})
    assert second["error"]["code"] == "verdict_exists"
    assert f"episode {episode} already has a verdict: success" in second["error"]["message"]
    assert "clean grasp" in second["error"]["message"]
    replaced = client.request("verdict", {"success": False, "notes": "dropped", "replace": True})
    assert replaced["ok"] and replaced["result"]["success"] is False
    mine = [v for v in client.request("stats")["result"]["verdicts"] if v["episode"] == episode]
    assert len(mine) == 1 and mine[0]["notes"] == "dropped"
    client.request("stop")
    client.request("reset_done")


def test_start_takes_a_task_and_params_set_is_refused_by_name(daemon, client):
    """(The demo policy declares no inference parameter: the worker refuses each by name.)"""
    client.request("clear_fault")
    started = client.request("start", {"task": "put the red cube in the bowl"})
    assert started["ok"], started
    daemon.wait_line(r"operator: start task='put the red cube in the bowl'")
    client.request("stop")
    client.request("reset_done")
    unknown = client.request("params", {"set": {"gain": 1}})
    assert unknown["error"]["code"] == "bad_params" and "gain" in unknown["error"]["message"]
    assert client.request("params")["result"]["config"]["control"]["hz"] == 30


def test_a_huge_request_is_refused_unread_and_logged_short(daemon, client):
    before = client.request("status")["result"]["state"]
    reply = raw_request(
        daemon.control_endpoint,
        wire.packb({"id": 1, "cmd": "reset_done", "args": {"task": "x" * 500_000}}),
    )
    assert reply["error"]["code"] == "too_large"
    # over a megabyte the frame is not even taken in: ZeroMQ drops that peer, no reply
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.control_endpoint)
    try:
        sock.send(wire.packb({"id": 2, "cmd": "reset_done", "args": {"task": "x" * (50 << 20)}}))
        assert not sock.poll(1000)
    finally:
        sock.close()
    assert client.request("status")["result"]["state"] == before
    assert max(len(line) for line in daemon.log) < 1000  # arguments only ever summarised


def test_robotctl_command_line(daemon):
    env = {**os.environ, "ROBOTD_ENDPOINT": daemon.control_endpoint}
    out = subprocess.run(
        [sys.executable, "-m", "robotd.operator.robotctl", "status"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and out.stdout.startswith("state ")
    bad = subprocess.run(
        [sys.executable, "-m", "robotd.operator.robotctl", "reset_done"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 1 and "reset_done: bad_state" in bad.stderr


def test_estop_when_the_main_process_hangs_is_confirmed_by_the_lane(
    daemon, client
):
    import signal

    from tests.daemon_util import wait_until

    client.request("clear_fault")
    assert client.request("start")["result"]["state"] == "RUNNING"
    env = {**os.environ, "ROBOTD_ENDPOINT": daemon.control_endpoint}
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "robotd.operator.robotctl", "estop", "--timeout", "0.5"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    # The control lane itself acknowledged it on lane.sock: that is a confirmation.
    assert out.returncode == 0, out.stderr
    assert "FAULT — e-stop" in out.stdout and "via      lane.sock" in out.stdout

    def latched() -> bool:
        st = client.request("status")["result"]
        return st["state"] == "FAULT" and st["fault"]["cause"] == "estop"

    wait_until(latched, 10, "the lane's e-stop to show in status")  # it was taken all the same
    client.request("clear_fault")


def test_twenty_estops_while_the_main_process_is_stopped_crash_nothing(daemon, client):
    """SIGSTOP the main process, e-stop straight to the lane (robotctl's fallback), SIGCONT:
    twenty times. Each e-stop is confirmed by the lane, and the daemon goes on afterwards
    (what the lane emitted meanwhile is taken in, late acknowledgements ignored)."""
    import signal

    from robotd.operator.client import estop_via_lane
    from tests.daemon_util import wait_until

    for i in range(20):
        client.request("clear_fault")
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        try:
            got = estop_via_lane(daemon.control_endpoint, f"stopped main {i}", 5.0)
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        assert got["state"] == "FAULT" and got["via"] == "lane.sock"
        # once main has taken in what the lane told it while it was stopped
        wait_until(
            lambda: client.request("status")["result"]["state"] == "FAULT", 10, "FAULT in status"
        )
    assert daemon.proc.poll() is None
    assert client.request("clear_fault")["ok"]
    assert client.request("status")["result"]["state"] == "IDLE"


def _control_process(daemon) -> int:
    from pathlib import Path

    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat_ = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat_[1]) == daemon.proc.pid and b"robotd.control" in cmdline:
            return int(proc.name)
    raise AssertionError("no control process under the daemon")


@pytest.mark.parametrize(
    "args",
    [{"reason": "x" * 201}, {"reason": 7}, {"reason": "r", "now": True}],
    ids=["too-long", "not-a-string", "unknown-arg"],
)
def test_an_estop_is_carried_out_whatever_is_wrong_with_its_arguments(daemon, client, args):
    client.request("clear_fault")
    assert client.request("status")["result"]["state"] == "IDLE"
    request = wire.packb({"id": 30, "cmd": "estop", "args": args})
    reply = raw_request(daemon.control_endpoint, request)
    assert reply["ok"] is True and reply["id"] == 30, reply
    fault = reply["result"]["fault"]
    assert reply["result"]["state"] == "FAULT" and fault["cause"] == "estop"
    assert len(fault["detail"]) <= 200
    if args["reason"] == 7:  # named, not dropped: the fault shows a reason was given
        assert fault["detail"] == "operator e-stop (its reason was an int)", fault
    client.request("clear_fault")


def test_commands_taken_before_an_estop_do_not_undo_it(daemon, client):
    """The lane takes e-stops first (their own socket): a clear_fault and a start sent to
    the daemon before an e-stop, and still on their way to a stalled lane, must be refused
    when it takes them after the e-stop, not carried out (the robot moving again)."""
    import signal

    client.request("clear_fault")  # whatever latched before: "first" is the first cause
    client.request("estop", {"reason": "first"})
    lane = _control_process(daemon)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.control_endpoint)
    os.kill(lane, signal.SIGSTOP)
    try:
        sock.send(wire.packb({"id": 41, "cmd": "clear_fault"}))
        sock.send(wire.packb({"id": 42, "cmd": "start", "args": {"task": "barrier-42"}}))
        daemon.wait_line(r"operator: start .*barrier-42")  # both taken, sent down, queued
        sock.send(wire.packb({"id": 43, "cmd": "estop", "args": {"reason": "the last word"}}))
        daemon.wait_line(r"operator: estop .*the last word")
    finally:
        os.kill(lane, signal.SIGCONT)
    replies = {}
    while len(replies) < 3:
        assert sock.poll(15000), f"only {sorted(replies)} answered"
        r = wire.unpackb(sock.recv())
        replies[r["id"]] = r
    sock.close()
    for rid in (41, 42):
        assert replies[rid]["ok"] is False and replies[rid]["error"]["code"] == "superseded"
    assert replies[43]["ok"] is True
    st = client.request("status")["result"]
    assert st["state"] == "FAULT" and st["fault"]["detail"] == "first", st  # the first shown
    assert st["fault"]["latest_detail"] == "the last word", st  # the last one carried out
    assert client.request("clear_fault")["result"]["state"] == "IDLE"  # taken after: carried out
    # the log says what did not happen, and why
    daemon.wait_line(r"WARNING .*operator: clear_fault failed: superseded: clear_fault was sent")


def test_a_command_unread_while_the_main_process_hung_does_not_undo_a_later_estop(
    daemon, client
):
    """An operator's clear_fault waits unread while the main process is stopped; another
    operator's e-stop goes straight to the lane meanwhile (robotctl's fallback). Once the
    main process runs again it takes the clear_fault: stamped with its local sender's own
    send time, it is older than the e-stop, so it is refused, not carried out."""
    import signal

    from robotd.operator.client import estop_via_lane

    client.request("clear_fault")  # whatever latched before: "first" is the first cause
    client.request("estop", {"reason": "first"})
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.control_endpoint)
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        sent = {"id": 51, "cmd": "clear_fault", "sent_ns": time.monotonic_ns()}
        sock.send(wire.packb(sent))
        got = estop_via_lane(daemon.control_endpoint, "while main hung", 15.0)
        assert got["state"] == "FAULT" and got["via"] == "lane.sock"
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    assert sock.poll(15000), "the clear_fault was never answered"
    reply = wire.unpackb(sock.recv())
    sock.close()
    assert reply["id"] == 51 and reply["ok"] is False, reply
    assert reply["error"]["code"] == "superseded", reply
    st = client.request("status")["result"]
    assert st["state"] == "FAULT" and st["fault"]["detail"] == "first", st  # the first shown
    assert st["fault"]["latest_detail"] == "while main hung", st  # the lane's own took
    assert client.request("clear_fault")["result"]["state"] == "IDLE"


def test_a_bad_sent_ns_is_refused_by_name(daemon):
    for bad in (0, -5, "now", 1.5):
        reply = raw_request(
            daemon.control_endpoint, wire.packb({"id": 60, "cmd": "status", "sent_ns": bad})
        )
        assert reply["ok"] is False and "sent_ns" in reply["error"]["message"], reply
