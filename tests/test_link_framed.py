"""The act link framed (protocol 2) end to end: PolicyClient against a real `robotd serve`
with its copy of the policy in a process of its own; arrays bit for bit both ways, chunks in
the policy's dtype, protocol-1 peers still served, and hostile frames refused while the
worker goes on."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest
import zmq
from copy_util import DEADLINE_S, Worker

from robotd import framed, wire
from robotd.link.chunks import ChunkLimits, prepare
from robotd.link.client import PolicyClient
from robotd.link.replies import ActReply, decode_act_reply

BIG = framed.MIN_OUT_OF_BAND


def run(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args, backend_options={"use_uvloop": True})


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    w = Worker("framed_policies:Digest")
    yield w
    w.stop()


def _random(dtype: str, n: int) -> np.ndarray:
    raw = np.random.default_rng(len(dtype)).integers(0, 256, n, dtype=np.uint8)
    if dtype == "bool":
        raw &= 1
    return raw.view(dtype)  # every bit pattern, NaN payloads included


def test_observations_of_every_dtype_arrive_bit_for_bit(worker: Worker) -> None:
    obs = {f"{i:02d}": _random(d, BIG * 2).reshape(2, -1) for i, d in enumerate(wire.DTYPES)}
    obs["small"] = np.arange(3, dtype=np.float32)  # rides inside the header

    async def main() -> None:
        client = PolicyClient(worker.endpoint, timeout_s=DEADLINE_S)
        hello = await client.connect()
        assert hello.protocol == 2 and client.protocol == 2
        sent = client.bytes_sent
        result = await client.act("F1", 0, [0], [obs])
        # The arrays travelled as frames of their own: the request is their bytes and a header.
        big = sum(a.nbytes for a in obs.values() if a.nbytes >= BIG)
        assert big < client.bytes_sent - sent < big + 2048
        for row, key in zip(result.actions, sorted(obs)):
            a = obs[key]
            assert row.tolist() == [zlib.crc32(a.tobytes()), a.nbytes, a.ndim, a.dtype.num, 0]
        await client.close()

    run(main)


@pytest.mark.parametrize(
    ("dtype", "rows", "cols"),
    # floats only: an integer answer is refused (tests/test_answers_bounds.py)
    [("float32", 64, 32), ("float16", 10, 8), ("float64", 50, 50), ("float64", 100, 14)],
)
def test_chunks_travel_in_the_policy_dtype(
    worker: Worker, dtype: str, rows: int, cols: int
) -> None:
    async def main() -> None:
        client = PolicyClient(worker.endpoint, timeout_s=DEADLINE_S)
        await client.connect()
        # A large image makes the request framed: then so is a large answer.
        obs = {"answer": [dtype, rows, cols], "img": np.zeros((224, 224, 3), np.uint8)}
        result = await client.act(f"C-{dtype}", 0, [0], [obs])
        expected = (np.arange(rows * cols) % 101).reshape(rows, cols).astype(dtype)
        assert result.actions.dtype == np.dtype(dtype)  # not upcast on the wire
        np.testing.assert_array_equal(result.actions, expected)
        assert not result.actions.flags.writeable
        played = prepare(result.actions, None, 30.0, ChunkLimits(max_rows=1024, dim=cols))
        assert played.dtype == np.float64  # converted once, robot-side
        np.testing.assert_array_equal(played, expected.astype(np.float64))
        await client.close()

    run(main)


def test_an_array_the_policy_keeps_is_never_overwritten_by_later_acts(worker: Worker) -> None:
    kept = _random("uint8", 224 * 224 * 3)

    async def main() -> None:
        client = PolicyClient(worker.endpoint, timeout_s=DEADLINE_S)
        await client.connect()
        await client.act("K1", 0, [0], [{"keep": kept}])
        for step in range(1, 4):  # arrays of the same size: the copy's buffers would fit
            other = np.full(kept.shape, step, np.uint8)
            result = await client.act("K1", step, [step], [{"x": other}])
            assert result.actions[-1, 0] == zlib.crc32(kept.tobytes())  # still as sent
        await client.end_episode("K1")
        await client.close()

    run(main)


def test_a_protocol_1_client_is_answered_in_one_frame(worker: Worker) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(worker.endpoint)
    try:
        sock.send(wire.packb({"id": 1, "cmd": "hello"}))
        assert sock.poll(DEADLINE_S * 1000)
        assert wire.unpackb(sock.recv())["result"]["protocol"] == 1  # it did not say 2
        img = _random("uint8", 224 * 224 * 3)
        act = {"id": 2, "cmd": "act", "episode": "P1", "step": 0, "steps": [0]}
        sock.send(wire.packb({**act, "observations": [{"answer": ["float32", 64, 32], "i": img}]}))
        assert sock.poll(DEADLINE_S * 1000)
        reply = sock.recv_multipart()
        assert len(reply) == 1  # one frame, arrays inside
        rows = wire.unpackb(reply[0])["result"]["actions"]
        assert rows.dtype == np.float32 and rows.shape == (64, 32)
    finally:
        sock.close()
        ctx.term()


def _ref(dtype: str, index: int, shape: tuple[int, ...]) -> msgspec.msgpack.Ext:
    head = struct.pack("<8sQQ", dtype.encode(), index, len(shape))
    return msgspec.msgpack.Ext(2, head + b"".join(struct.pack("<Q", n) for n in shape))


def _act(**obs: Any) -> bytes:
    msg = {"id": 9, "cmd": "act", "episode": "H", "step": 0, "steps": [0], "observations": [obs]}
    return msgspec.msgpack.encode(msg)


HOSTILE = [
    ([_act(a=_ref("uint8", 2, (4,))), b"1234"], 9, "refers to frame 2, but the message has 1"),
    ([_act(a=_ref("uint8", 1, (8,))), b"1234"], 9, "needs 8 bytes, its frame 1 has 4"),
    ([_act(a=_ref("float64", 1, (2, 3))), b"x" * 47], 9, "needs 48 bytes, its frame 1 has 47"),
    ([_act(a=1), b"extra"], 9, "frame 1 of 1 array frames is referenced by no array"),
    ([_act(a=_ref("uint8", 1, (4,)), b=_ref("uint8", 1, (4,))), b"1234"], 9, "two arrays"),
    ([_act(a=_ref("complex", 1, (4,))), b"1234"], 9, "dtype 'complex' not allowed"),
    ([b"\xc1\xc1garbage", b"1234"], None, "request is not msgpack"),
    ([msgspec.msgpack.encode([1, 2]), b"1234"], None, "must be a map"),
    ([_act(v=1)] * (framed.MAX_FRAMES + 1), None, f"at most {framed.MAX_FRAMES}"),
    (
        [msgspec.msgpack.encode({"id": 9, "cmd": "act", "episode": "H", "step": -1}), b"1"],
        9,
        "field 'step'",
    ),
]


@pytest.mark.parametrize(("frames", "rid", "needle"), HOSTILE)
def test_hostile_frames_are_refused_naming_why_and_the_worker_goes_on(
    worker: Worker, frames: list[bytes], rid: int | None, needle: str
) -> None:
    c = worker.client
    c.replies.clear()
    c.sock.send_multipart(frames)
    reply = c.recv(rid, timeout=20)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
    assert needle in reply["error"]["message"], reply
    good = c.request(
        {"cmd": "act", "episode": "H2", "step": 0, "steps": [0], "observations": [{"v": 1}]}
    )
    assert good["ok"] is True, good
    assert c.ping()["counts"]["copies_lost"] == 0


def test_an_act_reply_is_decoded_typed_and_anything_else_is_left_generic() -> None:
    """robotd.link.replies.decode_act_reply: the act's reply in one typed pass; an error,
    another command's result or a malformed act result is for the generic decoder."""
    rows = np.zeros((2, 3), np.float32)
    good = {"actions": rows, "step": 1, "episode": "e", "timing": {"infer_ms": 0.5}}
    typed = decode_act_reply(framed.pack({"id": 3, "ok": True, "result": good}))
    assert isinstance(typed, ActReply) and typed.id == 3 and typed.result.actions.shape == (2, 3)
    for other in (
        {"id": 3, "ok": False, "error": {"code": "busy", "message": "m"}},
        {"id": 3, "ok": True, "result": {"protocol": 2}},
        {"id": 3, "ok": True, "result": {**good, "timing": {"infer_ms": -1.0}}},
        {"id": "3", "ok": True, "result": good},
    ):
        assert decode_act_reply(framed.pack(other)) is None
