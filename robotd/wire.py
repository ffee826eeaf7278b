"""robotd's wire format: msgpack with numpy arrays as an extension type. Never pickle.

Contract:
- `packb(obj)` accepts None, bool, int, float, str, bytes, lists/tuples and str-keyed dicts
  of those, numpy scalars (packed as the equivalent Python scalar) and numpy arrays of a
  plain numeric dtype (bool, int8..int64, uint8..uint64, float16/32/64; any byte order,
  any strides). Anything else raises `WireError` naming the type or dtype.
- `unpackb(data)` returns the same structure (tuples come back as lists, numpy scalars as
  Python scalars). Map keys must be str or bytes (an int key packs but does not unpack).
  Untrusted input is bounded (total size, string and container lengths, nesting depth
  MAX_DEPTH) and every problem raises `WireError` naming it.
- Arrays come back READ-ONLY: they are zero-copy `np.frombuffer` views of the received
  bytes (fast for large frames, no per-element work). Call `.copy()` to modify one.
  Their data is 8-byte aligned on CPython (the header is a multiple of 8 bytes).

Array extension (msgpack ext type 1), all integers little-endian:
    bytes 0..7     dtype name, ASCII, NUL-padded: "bool", "int8" .. "uint64", "float16" ..
    bytes 8..15    ndim (uint64, at most 32)
    next 8*ndim    shape, one uint64 per axis
    rest           the elements, C order, little-endian; exactly prod(shape)*itemsize bytes
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import numpy as np

ARRAY_EXT = 1
MAX_NDIM = 32
MAX_DEPTH = 32  # containers inside containers; messages are a few levels deep
MAX_MESSAGE_BYTES = 1 << 30  # 1 GiB, the worker's total in-flight limit (SPEC §4)
MAX_STR_LEN = 16 << 20
MAX_CONTAINER_LEN = 1 << 20

_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
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
    )
}
_HEAD = struct.Struct("<8sQ")
_DIM = struct.Struct("<Q")


class WireError(ValueError):
    """Bytes that are not a valid robotd message, or an object that cannot be packed."""


def packb(obj: Any) -> bytes:
    """Pack `obj` to msgpack bytes; raises WireError for anything not representable."""
    try:
        return msgpack.packb(obj, default=_default, use_bin_type=True)
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as err:
        raise WireError(f"cannot pack: {err}") from None


def unpackb(data: bytes | bytearray | memoryview, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Unpack one message; raises WireError naming what is wrong with the bytes."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"expected bytes, got {type(data).__name__}")
    size = memoryview(data).nbytes
    if size > max_bytes:
        raise WireError(f"message of {size} bytes exceeds the limit of {max_bytes} bytes")
    try:
        obj = msgpack.unpackb(
            data,
            ext_hook=_ext_hook,
            raw=False,
            strict_map_key=True,
            max_str_len=min(size, MAX_STR_LEN),
            max_bin_len=size,
            max_ext_len=size,
            max_array_len=min(size, MAX_CONTAINER_LEN),
            max_map_len=min(size, MAX_CONTAINER_LEN),
        )
    except WireError:
        raise
    except msgpack.ExtraData:
        raise WireError("trailing bytes after the message") from None
    except msgpack.StackError:
        raise WireError(f"nesting deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as err:
        raise WireError(f"string is not valid UTF-8: {err.reason}") from None
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        text = str(err) or "bad format byte"
        if "incomplete" in text:
            text = "truncated message (incomplete input)"
        raise WireError(f"not a valid msgpack message: {text}") from None
    _check_depth(obj)
    return obj


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(ARRAY_EXT, _encode_array(obj))
    if isinstance(obj, np.bool_ | np.integer | np.floating):
        return obj.item()
    raise WireError(f"cannot pack object of type {type(obj).__module__}.{type(obj).__name__}")


def _encode_array(a: np.ndarray) -> bytes:
    name = a.dtype.name
    if name not in _DTYPES or a.dtype.fields is not None:
        raise WireError(
            f"cannot pack array of dtype {a.dtype.str!r} ({name}): only bool, int8..64, "
            "uint8..64 and float16/32/64 travel"
        )
    if a.ndim > MAX_NDIM:
        raise WireError(f"cannot pack array of {a.ndim} dimensions (at most {MAX_NDIM})")
    # Normalise to little-endian C order; a no-op (no copy) for the usual native arrays.
    a = a.astype(_DTYPES[name], order="C", copy=False)
    head = _HEAD.pack(name.encode("ascii"), a.ndim) + b"".join(_DIM.pack(n) for n in a.shape)
    return b"".join((head, a.reshape(-1).data if a.size else b""))


def _ext_hook(code: int, data: bytes) -> np.ndarray:
    if code != ARRAY_EXT:
        raise WireError(f"unknown msgpack extension type {code} (only {ARRAY_EXT}: ndarray)")
    if len(data) < _HEAD.size:
        raise WireError(f"ndarray header truncated: {len(data)} bytes, need {_HEAD.size}")
    raw_name, ndim = _HEAD.unpack_from(data, 0)
    name = raw_name.rstrip(b"\0").decode("ascii", errors="replace")
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise WireError(
            f"ndarray dtype {name!r} not allowed (bool, int8..64, uint8..64, float16/32/64 only)"
        )
    if ndim > MAX_NDIM:
        raise WireError(f"ndarray has {ndim} dimensions (at most {MAX_NDIM})")
    offset = _HEAD.size + _DIM.size * ndim
    if len(data) < offset:
        raise WireError(f"ndarray shape truncated: {len(data)} bytes, need {offset}")
    shape = tuple(_DIM.unpack_from(data, _HEAD.size + _DIM.size * i)[0] for i in range(ndim))
    expected = math.prod(shape) * dtype.itemsize  # Python ints: a huge shape cannot overflow
    if len(data) - offset != expected:
        raise WireError(
            f"ndarray {name}{list(shape)} needs {expected} data bytes, got {len(data) - offset}"
        )
    out = np.frombuffer(data, dtype=dtype, offset=offset).reshape(shape)
    # A bool byte other than 0/1 makes numpy misbehave (True != True); refuse it.
    if dtype.kind == "b" and out.size and out.view(np.uint8).max() > 1:
        raise WireError(f"ndarray bool{list(shape)} holds bytes other than 0 and 1")
    return out


def _check_depth(obj: Any) -> None:
    """Reject nesting deeper than MAX_DEPTH without recursion (hostile input is untrusted)."""
    if type(obj) is not list and type(obj) is not dict:
        return
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise WireError(f"nesting deeper than {MAX_DEPTH} levels")
        children = node.values() if type(node) is dict else node
        stack.extend((c, depth + 1) for c in children if type(c) is list or type(c) is dict)
