"""Every operator request the daemon answers is in the trace, even one JSON cannot hold as
sent: a hostile client's raw msgpack with bytes keys and values is refused (or passed on)
as before, and its record is written with those parts made printable and marked."""

from __future__ import annotations

import json
import math

import msgpack
import pytest
import zmq

from robotd.trace.codec import encode
from robotd.trace.reader import read_all
from robotd.trace.sanitize import MAX_NOTED, sanitized
from tests.daemon_util import Daemon


def _raw(endpoint: str, payload: bytes) -> dict:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(payload)
        assert sock.poll(30_000), "no reply"
        return msgpack.unpackb(sock.recv(), raw=False)
    finally:
        sock.close()


def test_a_params_set_with_bytes_keys_is_answered_and_recorded_sanitized(tmp_path) -> None:
    d = Daemon(tmp_path, "--set", 'robot.start="latched"')  # no episode: the session file
    d.wait_line(r"operator socket")
    hostile = {"id": 9, "cmd": "params",
               "args": {"set": {b"\xffkey": 1, "ok": b"\x00\x1b[2J", "bytes:ff6b6579": 2}}}
    reply = _raw(d.control_endpoint, msgpack.packb(hostile, use_bin_type=True))
    assert reply["id"] == 9 and reply["ok"] is False, reply  # the worker has no such params
    fine = {"id": 10, "cmd": "params", "args": {"set": {"nope": 1}}}
    assert _raw(d.control_endpoint, msgpack.packb(fine))["id"] == 10
    d.signal()
    assert d.wait_exit() == 0
    log = "".join(d.wait_eof())
    assert "cannot encode" not in log, log[-3000:]
    (run,) = [p for p in d.traces.iterdir() if p.is_dir()]
    msgs, reader = read_all(run / "session.mcap")
    assert reader.status.complete, reader.status.message
    ops = [m.record for m in msgs if m.topic == "/operator"]
    assert [o["cmd"] for o in ops] == ["params", "params"], ops
    first, second = ops
    assert first["ok"] is False and first["error"] == reply["error"]["code"] + ": " + reply[
        "error"]["message"]
    # the client's own key "bytes:ff6b6579" kept its name; the bytes key that reads the same
    # is told apart, and the bytes value is hex, marked as bytes
    assert first["args"] == {"set": {"ok": {"bytes": "001b5b324a"}, "bytes:ff6b6579": 2,
                                     "bytes:ff6b6579#2": 1}}
    assert sorted(first["sanitized"]) == ["/set/bytes:ff6b6579#2", "/set/ok"]
    assert "sanitized" not in second and second["args"] == {"set": {"nope": 1}}


def test_sanitized_leaves_plain_json_alone_and_marks_the_rest() -> None:
    plain = {"set": {"a": [1, 2.5, None, True, "x"], "b": {"c": math.nan}}}
    out, changed = sanitized(plain)
    assert out == {"set": {"a": [1, 2.5, None, True, "x"], "b": {"c": out["set"]["b"]["c"]}}}
    assert changed == [] and math.isnan(out["set"]["b"]["c"])
    weird = {"set": {b"k/~": [b"\x01", {7: object.__new__(object)}], ("t/~",): 1.0}}
    out, changed = sanitized(weird)
    json.dumps(out, allow_nan=False)  # plain JSON now
    encode({"cmd": "params", "args": out})
    inner = out["set"]["bytes:6b2f7e"]
    assert inner[0] == {"bytes": "01"} and inner[1]["repr:7"]["repr"].startswith("<object")
    assert out["set"]["repr:('t/~',)"] == 1.0
    assert sorted(changed) == [  # JSON pointers: "/" and "~" in a name escaped
        "/set/bytes:6b2f7e", "/set/bytes:6b2f7e/0", "/set/bytes:6b2f7e/1/repr:7",
        "/set/repr:('t~1~0',)"]


def test_the_list_of_places_is_bounded() -> None:
    out, changed = sanitized({"set": {bytes([i]): b"v" for i in range(60)}})
    assert len(out["set"]) == 60
    assert len(changed) == MAX_NOTED + 1 and changed[-1] == f"… {60 - MAX_NOTED} more"


@pytest.mark.parametrize("bad", [object(), {b"x": {b"y": {b"z": set()}}}, [b""] * 3])
def test_sanitized_never_raises(bad) -> None:
    out, _ = sanitized(bad)
    json.dumps(out)
