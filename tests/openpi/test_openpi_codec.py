"""robotd.link.openpi.codec: openpi's msgpack numpy format, checked against openpi-client's
own msgpack_numpy (from PyPI, in the peer venv) both ways, and bounded for hostile input."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from peer_describe import describe
from peer_venv import HERE

from robotd.link.openpi import codec
from robotd.link.openpi.errors import CodecError

DTYPES = ["|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"]
DTYPES += [">i2", ">i4", ">u8", ">f4", ">f8"]


def _array_map(
    dtype: Any = "<f4", shape: Any = (2,), data: Any = None, extra: dict | None = None
) -> dict:
    if data is None:
        data = bytes(8)
    m = {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}
    m.update(extra or {})
    return m


def _raw(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _random_samples(rng: np.random.Generator, n: int) -> list[Any]:
    """Random messages of the kinds openpi requests and replies hold."""
    out: list[Any] = []
    for _ in range(n):
        dtype = np.dtype(DTYPES[rng.integers(len(DTYPES))])
        shape = tuple(int(s) for s in rng.integers(0, 5, size=rng.integers(0, 4)))
        arr = rng.integers(0, 2 if dtype.kind == "b" else 100, size=shape).astype(dtype)
        if rng.random() < 0.3 and arr.ndim >= 2:
            arr = arr[:, ::2]  # non-contiguous
        kind = rng.integers(4)
        if kind == 0:
            out.append(arr)
        elif kind == 1:
            out.append(arr.dtype.type(arr.reshape(-1)[0]) if arr.size else np.float32(0.5))
        elif kind == 2:
            out.append({"a": arr, "n": {"x": [arr, "s", 1, 2.5, None, True, b"b"]}})
        else:
            out.append([arr, {"k": np.float64(rng.random())}])
    return out


def _plain(v: Any) -> Any:
    """What a message reads as after a round trip, in openpi as here: np.float64 is a
    Python float subclass, which msgpack packs as a plain float; tuples come back as lists."""
    if isinstance(v, np.float64) and v.shape == ():
        return float(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def _assert_same(a: Any, b: Any) -> None:
    """Equal values, dtypes (byte order included) and shapes (after `_plain`)."""
    a = _plain(a)
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.dtype.str == b.dtype.str
        assert a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, np.generic):
        assert isinstance(b, np.generic) and a.dtype.str == b.dtype.str and a == b
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert type(a) is type(b) and a == b


def _no_writeable(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _no_writeable(v) for k, v in d.items() if k != "writeable"}
    if isinstance(d, list):
        return [_no_writeable(v) for v in d]
    return d


def test_interop_both_ways_with_openpi_client(peer: Path, tmp_path: Path) -> None:
    """Ours → openpi's unpackb: the same values; openpi's packb → ours: the same values."""
    rng = np.random.default_rng(3)
    ours = [*_random_samples(rng, 300), np.zeros((224, 224, 3), np.uint8), np.bool_(False)]
    src, dst = tmp_path / "ours.msgpack", tmp_path / "theirs.msgpack"
    src.write_bytes(codec.packb(ours))
    proc = subprocess.run(
        [str(peer), str(HERE / "openpi_peer_codec.py"), str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    seen_by_openpi, openpi_samples = (json.loads(ln) for ln in proc.stdout.splitlines()[-2:])
    # tuples travel as lists; compare against our samples described the same way
    assert _no_writeable(seen_by_openpi) == _no_writeable(describe(_plain(ours)))
    decoded_again, theirs = codec.unpackb(dst.read_bytes())
    _assert_same(ours, decoded_again)
    assert _no_writeable(describe(theirs)) == _no_writeable(openpi_samples)
    assert any(isinstance(v, np.generic) for v in theirs)  # openpi's scalars decoded as such
    for arr in (a for a in theirs if isinstance(a, np.ndarray)):
        assert arr.flags.writeable and arr.flags.c_contiguous  # copies, not views


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
arrays = st.sampled_from(DTYPES).flatmap(
    lambda d: hnp.arrays(np.dtype(d), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0))
)
numpy_scalars = arrays.map(lambda a: a.dtype.type(a.reshape(-1)[0]) if a.size else np.int8(3))
values = st.recursive(
    st.one_of(scalars, arrays, numpy_scalars),
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_roundtrip(value: Any) -> None:
    back = codec.unpackb(codec.packb(value))
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        assert np.array_equal(back, value, equal_nan=True) and back.dtype.str == value.dtype.str
        return
    nan_free = not any(
        isinstance(x, np.ndarray | np.generic) and x.dtype.kind == "f" and np.isnan(x).any()
        for x in _leaves(value)
    )
    if nan_free:
        _assert_same(value, back)


def _leaves(v: Any) -> list[Any]:
    if isinstance(v, dict):
        return [x for u in v.values() for x in _leaves(u)]
    if isinstance(v, list):
        return [x for u in v for x in _leaves(u)]
    return [v]


def test_decoded_arrays_are_writable_copies() -> None:
    data = codec.packb({"a": np.arange(4, dtype=np.int32)})
    a = codec.unpackb(data)["a"]
    a[0] = 99  # would raise on openpi's read-only view
    assert codec.unpackb(data)["a"][0] == 0


@pytest.mark.parametrize(
    "value, where",
    [
        (np.array([object()]), "object"),
        ({"x": np.zeros(2, dtype=[("a", "<i4")])}, "at x"),
        ({"x": [0, np.zeros(2, dtype=np.complex64)]}, "at x.1"),
        (np.array(["text"]), "<U4"),
        (np.array([1], dtype="datetime64[s]"), "<M8"),
        (np.zeros(1, dtype="V4"), "V4"),
        (np.complex128(1j), "numpy scalar"),
        ({"k": {1, 2}}, "at k"),
        ({"k": 1 << 64}, "64 bits"),
    ],
)
def test_encode_refuses(value: Any, where: str) -> None:
    with pytest.raises(CodecError, match=where.replace("[", r"\[")):
        codec.packb(value)


def test_encoder_reusable_after_refusal() -> None:
    enc = codec.Encoder()
    with pytest.raises(CodecError):
        enc.encode({"a": [np.array([object()])]})
    assert codec.unpackb(enc.encode({"b": 1})) == {"b": 1}


BAD_MESSAGES = {
    "dtype object": _array_map(dtype="|O"),
    "dtype complex": _array_map(dtype="<c8"),
    "dtype structured": _array_map(dtype="[('a', '<i4')]"),
    "dtype subarray": _array_map(dtype="(2,)<i4"),
    "dtype string": _array_map(dtype="<U1"),
    "dtype datetime": _array_map(dtype="<M8[s]"),
    "dtype long double": _array_map(dtype="<f16", data=bytes(32)),
    "dtype not a str": _array_map(dtype=4),
    "shape negative": _array_map(shape=[-2]),
    "shape bool": _array_map(shape=[True, True]),
    "shape float": _array_map(shape=[2.0]),
    "shape not a list": _array_map(shape=2),
    "shape too many dims": _array_map(shape=[1] * 33, data=bytes(4)),
    "shape huge": _array_map(shape=[2**62, 2**62]),
    "data short": _array_map(data=bytes(7)),
    "data long": _array_map(data=bytes(9)),
    "data a str": _array_map(data="xxxxxxxx"),
    "extra key": _array_map(extra={b"extra": 1}),
    "missing key": {b"__ndarray__": True, b"data": bytes(8), b"dtype": "<f4"},
    "flag not true": _array_map(extra={b"__ndarray__": 1}),
    "bool byte 2": _array_map(dtype="|b1", shape=[2], data=b"\x01\x02"),
    "scalar int out of range": {b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"},
    "scalar bool as int": {b"__npgeneric__": True, b"data": 1, b"dtype": "|b1"},
    "scalar float for int": {b"__npgeneric__": True, b"data": 1.5, b"dtype": "<i4"},
    "scalar str": {b"__npgeneric__": True, b"data": "1", b"dtype": "<f8"},
    "scalar float16 overflow": {b"__npgeneric__": True, b"data": 1e300, b"dtype": "<f2"},
    "scalar extra key": {b"__npgeneric__": True, b"data": 1, b"dtype": "<i4", b"x": 0},
}


@pytest.mark.parametrize("name", sorted(BAD_MESSAGES))
def test_decode_refuses_bad_maps(name: str) -> None:
    data = _raw({"reply": {"inner": BAD_MESSAGES[name]}})
    with pytest.raises(CodecError, match=r"at reply\.inner"):
        codec.unpackb(data)


def _deep(n: int) -> bytes:
    return b"\x91" * n + b"\x00"  # n nested one-element arrays


@pytest.mark.parametrize(
    "data, what",
    [
        (_deep(codec.MAX_DEPTH + 1), "nesting"),
        (_deep(5000), "nesting"),
        (_raw([1]) + b"\x00", "trailing"),
        (_raw({"a": "x" * 50})[:-5], "truncated"),
        (b"\xc1", "msgpack"),
        (b"\xa2\xff\xfe", "UTF-8"),
        (_raw({1: 2}), "msgpack"),
        (msgpack.packb(msgpack.ExtType(5, b"x")), "extension"),
        (msgpack.packb(msgpack.Timestamp(1, 0)), "Timestamp"),
        (b"\xdd\xff\xff\xff\xff", "msgpack"),  # an array claiming 4 G entries
        (b"\xc6\xff\xff\xff\xff", "msgpack"),  # a bin claiming 4 GiB
    ],
)
def test_decode_refuses_hostile_bytes(data: bytes, what: str) -> None:
    with pytest.raises(CodecError, match=what):
        codec.unpackb(data)


def test_decode_bounds() -> None:
    with pytest.raises(CodecError, match="exceeds the limit"):
        codec.unpackb(bytes(100), max_bytes=99)
    with pytest.raises(CodecError, match="expected bytes"):
        codec.unpackb("text")  # type: ignore[arg-type]
    assert codec.unpackb(_deep(codec.MAX_DEPTH - 1)) is not None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_codec_errors(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        codec.unpackb(data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_messages_raise_only_codec_errors(data: st.DataObject) -> None:
    msg = bytearray(codec.packb({"actions": np.ones((3, 2), np.float32), "t": {"ms": 1.0}}))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(msg) - 1))
        msg[i] = data.draw(st.integers(0, 255))
    try:
        out = codec.unpackb(bytes(msg))
    except CodecError:
        return
    codec.packb(out)  # whatever decoded is a plain, encodable message
