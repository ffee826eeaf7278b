"""Fuzz the control socket of a real daemon: random bytes and random msgpack values are
each answered with an error, and the daemon keeps ticking with its state unchanged."""

from __future__ import annotations

import os
import random

import msgpack
import pytest
import zmq

from robotd import wire
from robotd.operator.client import ControlClient
from robotd.operator.requests import COMMANDS
from tests.daemon_util import Daemon

SOAK = os.environ.get("ROBOTD_SOAK") == "1"
N = 100_000 if SOAK else 10_000
BATCH = 250


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("fuzz"), "--set", 'robot.start="latched"')
    d.wait_line(r"operator socket")
    yield d
    d.signal()
    assert d.wait_exit() == 0


def _value(rng: random.Random, depth: int = 0):
    kinds = ["none", "bool", "int", "float", "str", "bytes"]
    if depth < 6:
        kinds += ["list", "map", "request"]
    kind = rng.choice(kinds)
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, -1, 2**63 - 1, -(2**63), 2**64 - 1, rng.randint(-1000, 1000)])
    if kind == "float":
        return rng.choice([float("nan"), float("inf"), -0.0, rng.uniform(-1e9, 1e9)])
    if kind == "str":
        return "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(0, 40)))
    if kind == "bytes":
        return rng.randbytes(rng.randint(0, 40))
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    if kind == "map":
        return {f"k{rng.randint(0, 9)}": _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    # something shaped like a request, but never a valid one: a known command always carries
    # an argument no command takes (a valid request would be answered ok, and could act)
    # (not estop: an e-stop is carried out whatever is wrong with its request, by design;
    # tests/test_operator.py checks that)
    cmd = rng.choice([*(c for c in COMMANDS if c != "estop"), "", "launch", None, 7, ["status"]])
    args = _value(rng, depth + 1) if rng.random() < 0.3 else {}
    if args is None or isinstance(args, dict):  # (None reads as no arguments)
        args = {**(args or {}), "zz_fuzz": _value(rng, depth + 1)}
    msg = {"id": _value(rng, depth + 1), "cmd": cmd, "args": args}
    if rng.random() < 0.2:
        msg[rng.choice(["extra", "ID", "k"])] = 1
    return msg


def _payloads(rng: random.Random, n: int) -> list[list[bytes]]:
    out = []
    for i in range(n):
        if i % 2:
            out.append([rng.randbytes(rng.randint(0, 200))])
        else:
            out.append([msgpack.packb(_value(rng), use_bin_type=True)])
        if rng.random() < 0.02:  # a message of several frames is not a request frame
            out[-1] = [*out[-1], rng.randbytes(8)]
    return out


@pytest.mark.soak
def test_fuzzed_requests_all_get_errors_and_change_nothing(daemon):
    client = ControlClient(daemon.control_endpoint, timeout_s=15)
    before = client.request("status")["result"]
    ticks_before = client.request("stats")["result"]["ticks"]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.control_endpoint)
    rng = random.Random(1234)
    payloads = _payloads(rng, 2 * N)  # N random byte strings and N random msgpack values
    answered = 0
    try:
        for start in range(0, len(payloads), BATCH):
            batch = payloads[start : start + BATCH]
            for frames in batch:
                sock.send_multipart(frames)
            for frames in batch:
                assert sock.poll(15000), f"no answer to {frames!r}"
                reply = wire.unpackb(sock.recv())
                assert reply["ok"] is False and reply["error"]["code"] in (
                    "bad_request",
                    "bad_args",
                    "unknown_command",
                    "too_large",
                ), (frames, reply)
                answered += 1
        after = client.request("status")["result"]
        ticks_after = client.request("stats")["result"]["ticks"]
    finally:
        sock.close()
        client.close()
    assert answered == 2 * N
    for key in ("state", "episode", "fault", "step", "torque"):
        assert after[key] == before[key], key
    assert ticks_after > ticks_before  # the loop kept ticking
    assert daemon.proc.poll() is None
