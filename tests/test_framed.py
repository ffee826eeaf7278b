"""robotd.framed: a msgpack header and each large array as a ZeroMQ frame of its own, over
real sockets, bit for bit, and every hostile message refused with its reason."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Annotated, Any

import msgspec
import numpy as np
import pytest
import zmq

from robotd import framed, wire
from robotd.framed import FieldError, WireError, pack, unpack

DTYPES = list(wire.DTYPES)
BIG = framed.MIN_OUT_OF_BAND


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A real DEALER -> ROUTER pair over ipc (frames come out as zmq.Frame, not copied)."""
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for s in (router, dealer):
        s.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    yield dealer, router
    router.close()
    dealer.close()
    ctx.term()


def travel(pair: tuple[zmq.Socket, zmq.Socket], frames: list[Any]) -> list[zmq.Frame]:
    dealer, router = pair
    dealer.send_multipart(frames, copy=False)
    assert router.poll(10_000)
    return router.recv_multipart(copy=False)[1:]  # after the route


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_goes_there_and_back_bit_for_bit(pair, dtype: str) -> None:
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, BIG * 3, dtype=np.uint8)
    if dtype == "bool":
        raw &= 1
    big = raw.view(dtype).reshape(3, -1)  # every bit pattern, NaN payloads included
    small = raw[:24].view(dtype)
    msg = {"id": 3, "obs": [{"big": big, "small": small, "s": "top"}], "n": np.int16(-4)}
    frames = pack(msg)
    assert len(frames) == 2 and memoryview(frames[1]).nbytes == big.nbytes  # raw bytes only
    back = unpack(travel(pair, frames))
    for key, sent in (("big", big), ("small", small)):
        got = back["obs"][0][key]
        assert got.dtype == np.dtype(dtype) and got.shape == sent.shape
        assert _bits(got) == _bits(sent)
        assert not got.flags.writeable
    assert back["id"] == 3 and back["n"] == -4 and back["obs"][0]["s"] == "top"


def test_shapes_strides_byte_orders_and_zero_sizes() -> None:
    cases = [
        np.arange(BIG, dtype=">f4").reshape(4, -1),  # big-endian: sent little-endian
        np.asfortranarray(np.arange(BIG, dtype=np.int32).reshape(64, -1)),
        np.arange(4 * BIG, dtype=np.uint16).reshape(8, -1)[:, ::2],  # strided
        np.ones((2,) * 12, np.float64),  # 12 dimensions, out of band
        np.zeros((0, 3), np.float32),
        np.array(2.5),
    ]
    for arr in cases:
        for threshold in (framed.MIN_OUT_OF_BAND, 0):  # 0: every array a frame of its own
            back = unpack(pack({"a": arr}, min_out_of_band=threshold))["a"]
            assert back.shape == arr.shape and back.dtype == arr.dtype.newbyteorder("<")
            np.testing.assert_array_equal(back, arr)


def test_a_received_array_goes_on_as_its_own_frame(pair) -> None:
    image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    received = unpack(travel(pair, pack({"top": image})))["top"]
    again = pack({"job": 1, "top": received, "part": received[1:]})
    assert isinstance(again[1], zmq.Frame)  # the very frame: nothing copied
    assert not isinstance(again[2], zmq.Frame)  # a slice is not the whole frame
    back = unpack(travel(pair, again))
    np.testing.assert_array_equal(back["top"], image)
    np.testing.assert_array_equal(back["part"], image[1:])


def test_a_message_without_large_arrays_is_a_protocol_1_message() -> None:
    msg = {"id": 1, "cmd": "act", "x": np.arange(3.0), "b": b"\x00\x01"}
    frames = pack(msg)
    assert len(frames) == 1
    back = wire.unpackb(frames[0])  # what a protocol-1 peer reads
    np.testing.assert_array_equal(back["x"], msg["x"])
    assert back["b"] == msg["b"]
    one = unpack([wire.packb(msg)])  # and what it sends is read here
    np.testing.assert_array_equal(one["x"], msg["x"])


def test_what_does_not_travel_is_refused() -> None:
    for obj, needle in [
        ({"x": object()}, "cannot pack object of type builtins.object"),
        ({"x": np.zeros(BIG, np.complex64)}, "dtype"),
        ({"x": np.array(["a"] * BIG)}, "dtype"),
        ({"x": 1 << 70}, "cannot pack"),
    ]:
        with pytest.raises(WireError, match=needle):
            pack(obj)


def _ref(dtype: str, index: int, shape: tuple[int, ...]) -> msgspec.msgpack.Ext:
    head = struct.pack("<8sQQ", dtype.encode(), index, len(shape))
    return msgspec.msgpack.Ext(2, head + b"".join(struct.pack("<Q", n) for n in shape))


def _header(**fields: Any) -> bytes:
    return msgspec.msgpack.encode(fields)


HOSTILE = [
    ([], "empty message"),
    ([b"\xc1garbage"], "not a valid msgpack message"),
    ([_header(a=1)[:-1]], "truncated"),
    ([_header(a=1) + b"\x00"], "trailing"),
    ([_header(a=_ref("uint8", 1, (4,)))], "refers to frame 1, but the message has 0 array frames"),
    ([_header(a=_ref("uint8", 2, (4,))), b"1234"], "refers to frame 2"),
    ([_header(a=_ref("uint8", 0, (4,))), b"1234"], "refers to frame 0"),
    ([_header(a=1), b"1234"], "frame 1 of 1 array frames is referenced by no array"),
    (
        [_header(a=_ref("uint8", 1, (4,)), b=_ref("uint8", 1, (4,))), b"1234"],
        "frame 1 is referenced by two arrays",
    ),
    ([_header(a=_ref("uint8", 1, (5,))), b"1234"], "needs 5 bytes, its frame 1 has 4"),
    ([_header(a=_ref("float32", 1, (2, 2))), b"1234"], "needs 16 bytes, its frame 1 has 4"),
    ([_header(a=_ref("uint8", 1, (2**40, 2**40))), b"1234"], "needs 1208925819614629174706176"),
    ([_header(a=_ref("object", 1, (4,))), b"1234"], "dtype 'object' not allowed"),
    ([_header(a=_ref("uint8", 1, (1,) * 33)), b"1"], "33 dimensions"),
    ([_header(a=msgspec.msgpack.Ext(2, b"short")), b"1"], "reference truncated"),
    ([_header(a=_ref("bool", 1, (4,))), b"\x00\x01\x02\x00"], "bytes other than 0 and 1"),
    ([_header(a=msgspec.msgpack.Ext(9, b"x"))], "unknown msgpack extension type 9"),
    ([_header(a={1: "x"})], "map key 1 is not a string"),
    ([b"\x91" * 40 + b"\x01"], "nesting deeper than 32"),
    ([b"\x91" * 5000 + b"\x01"], "nesting deeper than 32"),
    ([_header(a=_ref("uint8", 1, (0, 2**63))), b""], "Maximum allowed dimension"),
    ([b"\x01"] * (framed.MAX_FRAMES + 1), f"at most {framed.MAX_FRAMES}"),
    ([b"\xc0" * (framed.MAX_HEADER_BYTES + 1), b"1"], "header of 16777217 bytes"),
]


@pytest.mark.parametrize(("frames", "needle"), HOSTILE)
def test_hostile_messages_are_refused_naming_why(pair, frames: list[bytes], needle: str) -> None:
    with pytest.raises(WireError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        unpack(frames)
    if frames and len(frames) < 100:  # the same, received from a real socket
        with pytest.raises(WireError):
            unpack(travel(pair, frames))


def test_the_total_is_bounded_before_decoding() -> None:
    frames = pack({"a": np.zeros(BIG * 4, np.uint8)})
    with pytest.raises(WireError, match="exceeds the limit of 10000 bytes"):
        unpack(frames, max_bytes=10_000)
    assert unpack(frames, max_bytes=20_000)["a"].nbytes == BIG * 4


class _Typed(msgspec.Struct):
    id: int
    step: Annotated[int, msgspec.Meta(ge=0)]
    keys: list[Annotated[str, msgspec.Meta(min_length=1)]] = []
    obs: dict[str, Any] = {}


def test_typed_decoding_names_the_field() -> None:
    ok = unpack(pack({"id": 1, "step": 2, "obs": {"x": np.zeros(BIG, np.uint8)}}), _Typed)
    assert ok.step == 2 and ok.obs["x"].nbytes == BIG
    for msg, field, reason in [
        ({"id": "x", "step": 1}, "id", "expected int, got str"),
        ({"id": 1}, "step", "missing"),
        ({"id": 1, "step": -1}, "step", "expected int >= 0"),
        ({"id": 1, "step": True}, "step", "expected int, got bool"),
        ({"id": 1, "step": 1, "keys": ["a", ""]}, "keys[1]", "expected str of length >= 1"),
        ({"id": 1, "step": 1, "obs": {3: 1}}, "obs", "map key: expected str, got int"),
        ([1, 2], "", "expected object, got array"),
    ]:
        with pytest.raises(FieldError) as err:
            unpack(pack(msg), _Typed)
        assert (err.value.field, err.value.reason) == (field, reason), str(err.value)
