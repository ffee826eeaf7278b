"""A hostile or buggy operator client against a real daemon: an e-stop is carried out
whatever else is wrong with its request, and a flood of requests never starves the daemon's
own work (the up stream from the control lane, the policy link, the watchdog)."""

# ruff: noqa: F811 (the fixtures imported from tests.operator_util are named as params)
from __future__ import annotations

import time

import msgpack
import pytest
import zmq

from robotd import wire
from tests.operator_util import client, daemon  # noqa: F401 (fixtures)

FLOOD_CLIENTS = 10
FLOOD_EACH = 5000  # queued on the clients' side past the daemon's high-water mark
WINDOW_S = 5.0  # how long the flood is watched (unyielding, the loop was held all along)
# the age of the control lane's newest word as the main process has it: past about 2 s it
# would say the lane fell silent (a quiet run: under 0.3 s; an unyielding loop: the window)
MAX_LANE_AGE_S = 2.0


def dealer(endpoint: str, sndhwm: int = 1000) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, sndhwm)  # 0: no limit
    sock.connect(endpoint)
    return sock


def ask(endpoint: str, frames: list[bytes]) -> dict:
    sock = dealer(endpoint)
    try:
        sock.send_multipart(frames)
        assert sock.poll(15_000), f"no reply to {frames!r:.200}"
        return wire.unpackb(sock.recv())
    finally:
        sock.close()


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# Each is refused by the strict request decoding (so each would be refused if it were not
# an e-stop); each is carried out.
MALFORMED = {
    "reason not UTF-8": b"\x83\xa2id\x05\xa3cmd\xa5estop\xa4args\x81\xa6reason\xa2\xff\xfe",
    "extra field nested deep": pack({"id": 5, "cmd": "estop", "x": [[[[[[1]]]]]]}),
    "extra list of 65": pack({"id": 5, "cmd": "estop", "x": list(range(65))}),
    "int map key": pack({"id": 5, "cmd": "estop", 7: "seven"}),
    "extension type": pack({"id": 5, "cmd": "estop", "x": msgpack.ExtType(3, b"ab")}),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_estop_request_is_carried_out(daemon, client, name: str) -> None:
    assert client.request("clear_fault")["ok"]
    assert client.request("status")["result"]["state"] == "IDLE"
    reply = ask(daemon.control_endpoint, [MALFORMED[name]])
    assert reply["ok"] is True and reply["id"] == 5, reply
    assert reply["result"]["state"] == "FAULT" and reply["result"]["fault"]["cause"] == "estop"


def test_the_same_request_not_an_estop_is_still_refused(daemon) -> None:
    data = pack({"id": 6, "cmd": "status", "x": [[[[[[1]]]]]]})
    reply = ask(daemon.control_endpoint, [data])
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
    assert "nested deeper" in reply["error"]["message"]


@pytest.mark.parametrize("where", ["first", "last"])
def test_an_estop_among_other_frames_is_carried_out(daemon, client, where: str) -> None:
    assert client.request("clear_fault")["ok"]
    estop = pack({"id": 8, "cmd": "estop", "args": {"reason": "two frames"}})
    frames = [estop, b"junk"] if where == "first" else [b"junk", b"more", estop]
    reply = ask(daemon.control_endpoint, frames)
    assert reply["ok"] is True and reply["result"]["state"] == "FAULT", reply


@pytest.mark.parametrize("frames", [1, 2])
def test_a_req_client_gets_its_answers(daemon, client, frames: int) -> None:
    # REQ puts an empty delimiter before its message and reads a reply only past one
    assert client.request("clear_fault")["ok"]
    estop = pack({"id": 9, "cmd": "estop", "args": {"reason": "via REQ"}})
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.control_endpoint)
    try:
        sock.send(pack({"id": 8, "cmd": "status"}))
        assert sock.poll(15_000), "no reply to a REQ client's status"
        assert wire.unpackb(sock.recv())["id"] == 8
        sock.send_multipart([estop] if frames == 1 else [b"junk", estop])
        assert sock.poll(15_000), "no reply to a REQ client's e-stop"
        reply = wire.unpackb(sock.recv())
    finally:
        sock.close()
    assert reply["ok"] is True and reply["id"] == 9 and reply["result"]["state"] == "FAULT"


def test_a_request_flood_never_starves_the_daemon(daemon, client) -> None:
    """Ten clients queue a thousand requests each and read nothing back: meanwhile the main
    process keeps reading the control lane (its newest word stays young)."""
    ages = []
    flood = [dealer(daemon.control_endpoint, sndhwm=0) for _ in range(FLOOD_CLIENTS)]
    try:
        request = pack({"id": 1, "cmd": "stats"})
        for sock in flood:
            for _ in range(FLOOD_EACH):
                sock.send(request)
        end = time.monotonic() + WINDOW_S
        while time.monotonic() < end:  # each sample waits for its own answer
            stats = client.request("stats")["result"]
            ages.append(stats["lane_age_s"])
    finally:
        for sock in flood:
            sock.close()
    assert ages and max(ages) < MAX_LANE_AGE_S, ages


@pytest.mark.parametrize(
    "data, words",
    [
        (b"\xc1", "not a msgpack message: a byte that starts no msgpack value"),
        (b"\x91" * 10_000, "request nested deeper than 4 levels"),
        (b"\xda\xff\xff", "not a msgpack message: Unpack failed: incomplete input"),
    ],
)
def test_undecodable_bytes_are_refused_in_words(data: bytes, words: str) -> None:
    from robotd.operator.requests import RequestError, parse_request

    with pytest.raises(RequestError) as refused:
        parse_request(data)
    assert refused.value.code == "bad_request" and str(refused.value) == words
