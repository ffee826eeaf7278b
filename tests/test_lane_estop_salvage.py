"""lane.sock carries out an e-stop whatever else is wrong with its message, and a send time
from the future cannot lock the robot in FAULT (real ipc sockets, the real control lane
ticked by hand)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from robotd.lane import codec
from robotd.lane.messages import Command, Estop, Reply
from robotd.lane.salvage import MAX_BODIES, salvage_estop, split_envelope
from robotd.operator.requests import lane_args, parse_request, split_request
from tests.lane_util import LaneRig, wait_in_socket


@pytest.fixture
def rig() -> Iterator[LaneRig]:
    with tempfile.TemporaryDirectory(prefix="rbt-salv-") as tmp:
        r = LaneRig(Path(tmp), 'robot.start="idle"')
        r.tick()
        yield r
        r.close()


def answer(sock: zmq.Socket) -> Reply:
    assert sock.poll(5000), "lane.sock never answered"
    frames = sock.recv_multipart()
    reply = codec.decode_up(frames[-1])
    assert isinstance(reply, Reply)
    return reply


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# Each would be refused by the strict Estop decoding; each is an e-stop all the same.
MALFORMED_ESTOPS = {
    "reason over 500": (pack({"k": "estop", "id": 3, "reason": "x" * 900}), 3, "x" * 500),
    "unknown field": (pack({"k": "estop", "id": 4, "reason": "r", "who": "bob"}), 4, "r"),
    "id a string": (pack({"k": "estop", "id": "four", "reason": "r"}), None, "r"),
    "sent_ns negative": (pack({"k": "estop", "id": 6, "sent_ns": -1}), 6, ""),
    "sent_ns a float": (pack({"k": "estop", "id": 7, "sent_ns": 1.5}), 7, ""),
    "reason not UTF-8": (b"\x83\xa1k\xa5estop\xa2id\x08\xa6reason\xa2\xff\xfe", 8, "\ufffd\ufffd"),
    "reason a list": (
        pack({"k": "estop", "id": 9, "reason": [1, 2]}),
        9,
        "e-stop on lane.sock (its reason was a list)",
    ),
    "deep extra field": (pack({"k": "estop", "id": 10, "x": [[[[[[1]]]]]]}), 10, ""),
    "int map key": (pack({"k": "estop", "id": 11, 5: "five"}), 11, ""),
}


@pytest.mark.parametrize("name", list(MALFORMED_ESTOPS))
def test_a_malformed_estop_is_carried_out_and_counted(rig: LaneRig, name: str) -> None:
    data, rid, reason = MALFORMED_ESTOPS[name]
    with pytest.raises(codec.LaneError):
        codec.decode_estop(data)  # the strict decoder refuses it: what this test is about
    rig.estop.send(data)
    wait_in_socket(rig.lane.ports.estop)
    got = rig.tick()
    ack = answer(rig.estop)
    assert ack.ok and ack.id == rid and ack.status.state == "FAULT", ack
    assert rig.lane.kernel.machine.fault.cause == "estop"
    names = [m["name"] for m in got if m["k"] == "event"]
    assert "lane_estop_salvaged" in names and "lane_estop" in names, names
    said = next(m for m in got if m["k"] == "event" and m["name"] == "lane_estop")
    assert said["reason"] == reason
    assert rig.lane.kernel.counters.bad_messages == 1


def test_an_estop_among_other_frames_is_carried_out(rig: LaneRig) -> None:
    rig.estop.send_multipart([codec.encode(Estop(21, "first")), b"junk"])
    wait_in_socket(rig.lane.ports.estop)
    rig.tick()
    assert answer(rig.estop).id == 21
    rig.estop.send_multipart([b"junk", b"", codec.encode(Estop(22, "third"))])
    wait_in_socket(rig.lane.ports.estop)
    rig.tick()
    ack = answer(rig.estop)
    assert ack.ok and ack.id == 22 and ack.status.state == "FAULT"


def test_a_req_client_gets_its_answer_too(rig: LaneRig) -> None:
    # REQ puts an empty delimiter before its message and reads only past one in the reply
    req = zmq.Context.instance().socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    try:
        req.connect(rig.lane.spec.estop)
        req.send(codec.encode(Estop(31, "via REQ")))
        wait_in_socket(rig.lane.ports.estop)
        rig.tick()
        ack = answer(req)
        assert ack.ok and ack.id == 31
    finally:
        req.close()


def test_what_is_not_an_estop_is_refused_saying_why(rig: LaneRig) -> None:
    rig.estop.send(pack({"k": "cmd", "id": 1, "cmd": "start"}))
    wait_in_socket(rig.lane.ports.estop)
    got = rig.tick()
    refused = answer(rig.estop)
    assert not refused.ok and refused.code == "refused"
    assert refused.message.startswith("lane.sock takes the e-stop only: "), refused.message
    assert len(refused.message) > len("lane.sock takes the e-stop only: ") + 5
    assert [m["name"] for m in got if m["k"] == "event"] == ["lane_refused"]
    assert rig.lane.kernel.machine.state == "IDLE"


def test_an_estop_sent_from_the_future_cannot_supersede_every_later_command(
    rig: LaneRig,
) -> None:
    # a wall-clock timestamp where the monotonic one goes: decades ahead of the lane's now
    rig.estop.send(codec.encode(Estop(41, "wrong clock", time.time_ns())))
    wait_in_socket(rig.lane.ports.estop)
    rig.tick()
    assert answer(rig.estop).ok
    assert rig.lane.kernel.machine.state == "FAULT"
    rig.send(Command(42, "clear_fault", sent_ns=time.monotonic_ns()))
    wait_in_socket(rig.lane.ports.down)
    replies = [m for m in rig.tick() if m["k"] == "reply"]
    assert replies and replies[0]["id"] == 42 and replies[0]["ok"], replies
    assert rig.lane.kernel.machine.state == "IDLE"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used in msgpack
        pack([1, 2, 3]),
        pack({"k": "cmd"}),
        pack({"k": b"estop"}),  # bytes, not the string "estop"
        pack({"k": "estop", "x": "y" * 5000}),  # over max_bytes
        pack({"k": "estop"})[:-2],  # cut short
        pack({(1, 2): "k", "k": 7}),
    ],
)
def test_salvage_finds_no_estop_where_there_is_none(data: bytes) -> None:
    got = salvage_estop(
        data,
        kind_key="k",
        reason_in_args=False,
        max_bytes=4096,
        max_reason=500,
        max_str_id=None,
        label="lane",
    )
    assert got is None


def _operator_salvage(data: bytes, max_str_id: int | None = 64):
    return salvage_estop(
        data,
        kind_key="cmd",
        reason_in_args=True,
        max_bytes=16384,
        max_reason=200,
        max_str_id=max_str_id,
        label="operator e-stop",
    )


def test_salvage_reads_the_operator_request_shape() -> None:
    data = pack({"id": "a" * 64, "cmd": "estop", "args": {"reason": "r" * 300}, "sent_ns": 5})
    got = _operator_salvage(data)
    assert got is not None and got.rid == "a" * 64 and got.reason == "r" * 200
    assert got.sent_ns == 5
    long_id = pack({"id": "a" * 65, "cmd": "estop", "sent_ns": 0})
    got = _operator_salvage(long_id)
    assert got is not None and got.rid is None and got.sent_ns is None and got.reason == ""


def test_the_id_limit_is_the_callers() -> None:
    data = pack({"id": "abcd", "cmd": "estop"})
    assert _operator_salvage(data, max_str_id=4).rid == "abcd"
    assert _operator_salvage(data, max_str_id=3).rid is None
    assert _operator_salvage(data, max_str_id=None).rid is None  # integer ids only
    assert _operator_salvage(pack({"id": 7, "cmd": "estop"}), max_str_id=None).rid == 7


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        (7, "operator e-stop (its reason was an int)"),
        ([1, 2], "operator e-stop (its reason was a list)"),
        (b"stop", "operator e-stop (its reason was a bytes)"),
        (None, ""),  # no reason given: the door's own words, later
    ],
)
def test_an_operator_estop_with_a_reason_of_the_wrong_type_says_so_however_it_came(
    reason: Any, said: str
) -> None:
    # the same words whether the request passes the strict decoding or not: one path
    strict = pack({"id": 1, "cmd": "estop", "args": {"reason": reason}})
    malformed = pack({"id": 1, "cmd": "estop", "args": {"reason": reason}, 5: [[[[[1]]]]]})
    for data in (strict, malformed):
        req = parse_request(data)
        assert (req.cmd, req.rid, req.args) == ("estop", 1, {"reason": said}), req
    assert lane_args(parse_request(strict)) == {"reason": said or "operator e-stop"}


def test_the_main_process_hears_of_a_lane_sock_estop_in_its_tick(rig: LaneRig) -> None:
    rig.estop.send(codec.encode(Estop(51, "hand in the way")))
    wait_in_socket(rig.lane.ports.estop)
    got = rig.tick()
    assert answer(rig.estop).ok
    states = [m for m in got if m["k"] == "state"]
    assert states and states[-1]["state"] == "FAULT", got  # not only at the next stats


@pytest.mark.parametrize(
    ("frames", "envelope", "bodies"),
    [
        ([b"peer", b"m"], [b"peer"], [b"m"]),  # a DEALER's
        ([b"peer", b"", b"m"], [b"peer", b""], [b"m"]),  # a REQ's: the delimiter kept
        ([b"peer", b""], [b"peer"], [b""]),  # an empty body, not a delimiter
        ([b"peer", b"", b"a", b"b"], [b"peer", b""], [b"a", b"b"]),
        ([b"peer", b"a", b"", b"b"], [b"peer"], [b"a", b"", b"b"]),
        ([b"peer"], [b"peer"], []),
        ([b"peer", *[b"x"] * 20], [b"peer"], [b"x"] * MAX_BODIES),  # only so many searched
    ],
)
def test_both_doors_split_a_message_by_one_rule(
    frames: list[bytes], envelope: list[bytes], bodies: list[bytes]
) -> None:
    assert split_envelope(frames) == (envelope, bodies)
    want = bodies[0] if len(bodies) == 1 else None  # none of these bodies is an e-stop
    assert split_request(frames) == (envelope, want)


def test_the_operator_door_finds_an_estop_among_a_req_clients_frames() -> None:
    estop = pack({"id": 9, "cmd": "estop"})
    assert split_request([b"peer", b"", b"junk", estop]) == ([b"peer", b""], estop)
