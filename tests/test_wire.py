"""robotd.wire: msgpack with numpy arrays, bounded against hostile input, never pickle."""

from __future__ import annotations

import pickle
import struct

import msgpack
import numpy as np
import pytest

from robotd import wire
from robotd.wire import WireError, packb, unpackb

DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]


def _ext(payload: bytes, code: int = wire.ARRAY_EXT) -> bytes:
    return msgpack.packb({"a": msgpack.ExtType(code, payload)}, use_bin_type=True)


def _header(dtype: str, shape: tuple[int, ...]) -> bytes:
    return struct.pack("<8sQ", dtype.encode(), len(shape)) + b"".join(
        struct.pack("<Q", n) for n in shape
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_each_dtype_nested(dtype: str) -> None:
    rng = np.random.default_rng(0)
    arr = (rng.random((3, 4, 2)) * 100).astype(dtype)
    msg = {"id": 7, "obs": [{"x": arr, "name": "top"}, {"y": [arr[0], None, 1.5]}], "b": b"\x00"}
    back = unpackb(packb(msg))
    np.testing.assert_array_equal(back["obs"][0]["x"], arr)
    assert back["obs"][0]["x"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back["obs"][1]["y"][0], arr[0])
    assert back["obs"][1]["y"][1:] == [None, 1.5]
    assert back["id"] == 7 and back["b"] == b"\x00" and back["obs"][0]["name"] == "top"


def test_zero_d_empty_non_contiguous_and_big_endian_arrays() -> None:
    cases = [
        np.array(3.25),
        np.zeros((0,), np.float32),
        np.zeros((2, 0, 5), np.uint8),
        np.arange(24, dtype=np.int64).reshape(4, 6)[::2, ::3],
        np.arange(5, dtype=">f8"),
        np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
    ]
    for arr in cases:
        back = unpackb(packb(arr))
        assert back.shape == arr.shape
        assert back.dtype == arr.dtype.newbyteorder("<")
        np.testing.assert_array_equal(back, arr)


def test_numpy_scalars_travel_as_python_scalars() -> None:
    back = unpackb(packb([np.float32(1.5), np.int64(-3), np.bool_(True), np.uint8(200)]))
    assert back == [1.5, -3, True, 200]
    assert [type(v) for v in back] == [float, int, bool, int]


def test_big_frame_round_trip_is_read_only() -> None:
    frame = np.random.default_rng(1).integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    back = unpackb(packb({"top": frame}))["top"]
    np.testing.assert_array_equal(back, frame)
    assert not back.flags.writeable
    with pytest.raises(ValueError):
        back[0, 0, 0] = 1
    back.copy()[0, 0, 0] = 1  # a copy is the documented way to modify


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        (np.array([1 + 2j]), "complex128"),
        (np.array(["a"]), "str"),
        (np.array([object()], dtype=object), "object"),
        (np.zeros(2, dtype=[("a", "<f4")]), "dtype"),
        (np.complex64(1), "complex64"),
        ({1, 2}, "set"),
        (object(), "object"),
    ],
)
def test_pack_refuses_what_does_not_travel(obj: object, needle: str) -> None:
    with pytest.raises(WireError, match=needle):
        packb({"x": obj})


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (_ext(_header("object", (2,)) + bytes(16)), "dtype 'object' not allowed"),
        (_ext(_header("float128", (1,)) + bytes(16)), "dtype 'float128' not allowed"),
        (_ext(_header("float64", (3,)) + bytes(16)), "needs 24 data bytes, got 16"),
        (_ext(_header("uint8", (2**40, 2**40)) + bytes(4)), "data bytes, got 4"),
        (_ext(_header("uint8", (1,) * 33)), "33 dimensions"),
        (_ext(b"float64\0" + struct.pack("<Q", 4) + bytes(8)), "shape truncated"),
        (_ext(b"abc"), "header truncated"),
        (_ext(_header("bool", (2,)) + b"\x01\x07"), "other than 0 and 1"),
        (_ext(b"", code=5), "unknown msgpack extension type 5"),
        (packb({"a": np.zeros(10)})[:-3], "truncated"),
        (b"\xc1", "not a valid msgpack"),
        (packb(1) + b"\x00", "trailing bytes"),
        (b"\x91" * 100 + b"\x01", "nesting deeper"),
        (b"\x91" * 5000 + b"\x01", "nesting deeper"),
        (b"\xa2\xff\xfe", "UTF-8"),
        (msgpack.packb({1: 2}), "not a valid msgpack"),
    ],
)
def test_hostile_input_is_refused_with_a_reason(data: bytes, needle: str) -> None:
    with pytest.raises(WireError, match=needle):
        unpackb(data)


def test_pickle_payload_is_rejected() -> None:
    class Boom:
        def __reduce__(self):  # would run on a pickle load
            return (print, ("pickle was loaded!",))

    for payload in (pickle.dumps({"a": np.zeros(3)}), pickle.dumps(Boom(), protocol=0)):
        with pytest.raises(WireError):
            unpackb(payload)


def test_size_limits() -> None:
    with pytest.raises(WireError, match="exceeds the limit"):
        unpackb(packb(b"x" * 1000), max_bytes=100)
    # A header claiming a huge container is bounded by the bytes actually present.
    with pytest.raises(WireError):
        unpackb(b"\xdd\xff\xff\xff\xff")
    with pytest.raises(WireError, match="expected bytes"):
        unpackb("not bytes")  # type: ignore[arg-type]
