"""A burst of lane commands never starves an e-stop (robotd/runtime/bridge.py): while
hundreds of refused commands wait, an e-stop from another client is still served, the
commands beyond MAX_PENDING are answered "busy" at once, and every request gets exactly
one reply, with nothing left unhandled in the daemon's log."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest
import zmq

from robotd import wire
from robotd.operator.client import ControlClient
from robotd.runtime.bridge import MAX_PENDING
from tests.daemon_util import Daemon, lane_pid

BURST = 500
DEADLINE_S = 120.0  # generous: a loaded 2-core CI box; this bounds the test, it times nothing


@pytest.fixture
def running(tmp_path):
    d = Daemon(tmp_path, "--set", 'robot.start="latched"')
    d.wait_line(r"operator socket")
    c = ControlClient(d.control_endpoint, timeout_s=60)
    assert c.request("clear_fault")["ok"]
    assert c.request("start")["result"]["state"] == "RUNNING"
    yield d, c
    c.close()


def send_burst(endpoint: str, n: int) -> zmq.Socket:
    """`n` reset_done requests (refused while RUNNING) sent back to back, none awaited."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # no high-water mark: every request leaves now
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(endpoint)
    for rid in range(1, n + 1):
        sock.send(wire.packb({"id": rid, "cmd": "reset_done", "args": {}}))
    return sock


def collect(sock: zmq.Socket, n: int) -> list[dict]:
    """Replies until `n` came (or the deadline passed: the caller then sees fewer)."""
    replies: list[dict] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(replies) < n and (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            replies.append(wire.unpackb(sock.recv()))
    return replies


def test_an_estop_is_served_through_a_burst_and_every_request_is_answered_once(running):
    daemon, operator = running
    burst = send_burst(daemon.control_endpoint, BURST)
    try:
        estop = operator.request("estop", {"reason": "burst test"})  # Unreachable if starved
        replies = collect(burst, BURST)
        assert not burst.poll(500), "a request was answered twice"  # nothing beyond BURST
    finally:
        burst.close()

    assert estop["ok"], estop
    assert estop["result"]["state"] == "FAULT"
    status = operator.request("status")["result"]
    assert status["state"] == "FAULT" and status["fault"]["cause"] == "estop"

    ids = Counter(r.get("id") for r in replies)
    assert len(replies) == BURST, f"{len(replies)} replies to {BURST} requests"
    assert set(ids) == set(range(1, BURST + 1)) and max(ids.values()) == 1
    codes = Counter("ok" if r["ok"] else r["error"]["code"] for r in replies)
    # the operator loop takes one request per turn, so the e-stop interleaves with the
    # burst: a reset_done taken before it, reaching the lane after it, is "superseded"
    assert set(codes) <= {"ok", "bad_state", "busy", "superseded"}, codes
    busy = [r["error"]["message"] for r in replies if not r["ok"] and r["error"]["code"] == "busy"]
    assert all("already wait" in m or "queue is full" in m for m in busy), busy[:3]

    assert operator.request("status")["ok"]  # the daemon goes on answering
    daemon.signal()
    assert daemon.wait_exit() == 0
    log = "".join(daemon.log)
    assert "Future exception was never retrieved" not in log
    assert "Traceback" not in log


def test_commands_beyond_the_bound_are_busy_at_once_while_the_lane_answers_nothing(running):
    """With the lane stopped no command can be answered by it: exactly MAX_PENDING wait,
    every other one is answered "busy" by the main process alone. (200 requests are taken
    in far less than the bridge's 5 s timeout, which would free slots.)"""
    daemon, operator = running
    n = 200
    lane = lane_pid(daemon)
    os.kill(lane, signal.SIGSTOP)
    try:
        burst = send_burst(daemon.control_endpoint, n)
        early = collect(burst, n - MAX_PENDING)
    finally:
        os.kill(lane, signal.SIGCONT)
    try:
        late = collect(burst, MAX_PENDING)  # the waiting ones, once the lane answers again
        assert not burst.poll(500), "a request was answered twice"
    finally:
        burst.close()
    assert [r["error"]["code"] for r in early] == ["busy"] * (n - MAX_PENDING)
    assert len(late) == MAX_PENDING
    assert {r["error"]["code"] for r in late} <= {"bad_state", "timeout"}
    assert sorted(r["id"] for r in early + late) == list(range(1, n + 1))
    assert operator.request("estop", {"reason": "after"})["result"]["state"] == "FAULT"
    assert "Traceback" not in "".join(daemon.log)
