"""The codec between the worker's main process and its copies of the policy (never pickle).

A message is a list of ZeroMQ frames: the first is msgpack (robotd.wire's encoding, arrays
as extension type 1); every numpy array of at least MIN_OUT_OF_BAND bytes travels instead as
a frame of its own, its raw C-order bytes, referenced from the msgpack by extension type 2
(dtype name, frame index, ndim, shape). Sent with ZeroMQ's zero-copy, a decoded camera
frame goes from the main process's memory to the socket without a copy in Python, and comes
out in the copy as a read-only array over the received frame (np.frombuffer, no copy).

Extension type 2 payload, little-endian: bytes 0..7 dtype name (NUL-padded ASCII), 8..15
frame index (uint64, 1-based: frame 0 is the msgpack), 16..23 ndim, then ndim uint64 axes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from robotd import wire

OUT_OF_BAND_EXT = 2
MIN_OUT_OF_BAND = 4096  # smaller arrays ride inside the msgpack frame
_HEAD = struct.Struct("<8sQQ")
_DIM = struct.Struct("<Q")

Buffer = bytes | memoryview


def pack(obj: Any) -> list[Buffer]:
    """`obj` as frames: [msgpack, raw array bytes, ...]; WireError if not representable."""
    parts: list[Buffer] = []

    def default(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.nbytes >= MIN_OUT_OF_BAND:
            return _out_of_band(value, parts)
        return wire._default(value)  # the wire's own types, or its WireError

    try:
        head = msgpack.packb(obj, default=default, use_bin_type=True)
    except wire.WireError:
        raise
    except (TypeError, ValueError, OverflowError) as err:
        raise wire.WireError(f"cannot pack: {err}") from None
    return [head, *parts]


def _out_of_band(a: np.ndarray, parts: list[Buffer]) -> msgpack.ExtType:
    name = a.dtype.name
    if name not in wire._DTYPES or a.dtype.fields is not None or a.ndim > wire.MAX_NDIM:
        return wire._default(a)  # refused there, with the wire's message
    a = a.astype(wire._DTYPES[name], order="C", copy=False)  # no copy for native C arrays
    parts.append(a.reshape(-1).data.cast("B"))
    head = _HEAD.pack(name.encode("ascii"), len(parts), a.ndim)
    return msgpack.ExtType(OUT_OF_BAND_EXT, head + b"".join(_DIM.pack(n) for n in a.shape))


def unpack(frames: Sequence[Buffer]) -> Any:
    """The object `pack` made (out-of-band arrays as read-only views of their frames);
    WireError naming what is wrong. Bounded as robotd.wire.unpackb is."""
    if not frames:
        raise wire.WireError("empty message")
    head = memoryview(frames[0])

    def hook(code: int, data: bytes) -> Any:
        if code == OUT_OF_BAND_EXT:
            return _array(data, frames)
        return wire._ext_hook(code, data)

    size = head.nbytes
    try:
        obj = msgpack.unpackb(
            head,
            ext_hook=hook,
            raw=False,
            strict_map_key=True,
            max_str_len=min(size, wire.MAX_STR_LEN),
            max_bin_len=size,
            max_ext_len=size,
            max_array_len=min(size, wire.MAX_CONTAINER_LEN),
            max_map_len=min(size, wire.MAX_CONTAINER_LEN),
        )
    except wire.WireError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        raise wire.WireError(f"not a valid message: {err}") from None
    wire._check_depth(obj)
    return obj


def _array(data: bytes, frames: Sequence[Buffer]) -> np.ndarray:
    if len(data) < _HEAD.size:
        raise wire.WireError("out-of-band array header truncated")
    raw_name, index, ndim = _HEAD.unpack_from(data, 0)
    dtype = wire._DTYPES.get(raw_name.rstrip(b"\0").decode("ascii", errors="replace"))
    if dtype is None or ndim > wire.MAX_NDIM or not 0 < index < len(frames):
        raise wire.WireError(f"out-of-band array: bad dtype, ndim or frame index {index}")
    if len(data) != _HEAD.size + _DIM.size * ndim:
        raise wire.WireError("out-of-band array shape truncated")
    shape = tuple(_DIM.unpack_from(data, _HEAD.size + _DIM.size * i)[0] for i in range(ndim))
    buf = memoryview(frames[index])
    if buf.nbytes != math.prod(shape) * dtype.itemsize:
        raise wire.WireError(f"out-of-band array {shape} does not match its {buf.nbytes} bytes")
    out = np.frombuffer(buf, dtype=dtype).reshape(shape)
    out.flags.writeable = False
    return out
