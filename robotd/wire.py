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
import sys
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

ARRAY_EXT = 1
MAX_NDIM = 32
MAX_DEPTH = 32  # containers inside containers; messages are a few levels deep
MAX_MESSAGE_BYTES = 1 << 30  # 1 GiB, the worker's total in-flight limit (worker_bytes)
MAX_STR_LEN = 16 << 20
MAX_CONTAINER_LEN = 1 << 20
# Items in all the containers of one message together (a map's pair counts once, as does a
# container itself): one byte of msgpack can be an empty list (56 bytes of Python) or a
# slot in one, so without a budget an 8 MiB message of nested empty lists took 600 MB and
# 11 s to decode. Messages put their bulk in bin or arrays, never in this many items.
MAX_ITEMS = 1 << 20

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
DTYPES = _DTYPES  # the dtypes that travel, by name (little-endian)
# Looked up by (kind, itemsize) and by the raw 8-byte name: numpy's dtype.name is computed
# in Python and costs more than packing a small array.
_BY_KIND = {(d.kind, d.itemsize): name for name, d in _DTYPES.items()}
_BY_RAW = {name.encode("ascii").ljust(8, b"\0"): d for name, d in _DTYPES.items()}
_BOOL = _DTYPES["bool"]
BY_RAW, BOOL = _BY_RAW, _BOOL  # (for robotd.framed's own ext hook)
_SWAP = ">" if sys.byteorder == "little" else "<="  # byte orders that are not the wire's
_HEAD = struct.Struct("<8sQ")
_DIM = struct.Struct("<Q")
SHAPES = [struct.Struct(f"<{n}Q") for n in range(MAX_NDIM + 1)]  # ndim -> its axes
INLINE_HEADS = [struct.Struct(f"<8sQ{n}Q") for n in range(MAX_NDIM + 1)]  # name, ndim, axes
_RAW_BY_KIND = {key: name.encode("ascii").ljust(8, b"\0") for key, name in _BY_KIND.items()}
RAW_BY_KIND = _RAW_BY_KIND  # (kind, itemsize) -> the 8-byte wire name


def wire_name(dtype: np.dtype) -> str | None:
    """The wire's name for `dtype` if it travels (bool, int8..64, uint8..64, float16..64,
    any byte order), else None."""
    return _BY_KIND.get((dtype.kind, dtype.itemsize))


def wire_dtype(raw_name: bytes) -> np.dtype | None:
    """The little-endian dtype a wire name (8 bytes, NUL-padded) stands for, or None."""
    return _BY_RAW.get(raw_name)


def raw_text(raw_name: bytes) -> str:
    """A wire dtype name as text, for messages."""
    return raw_name.rstrip(b"\0").decode("ascii", errors="replace")


def as_wire(a: np.ndarray) -> np.ndarray:
    """`a` as the wire carries it (C order, little-endian); itself when it already is."""
    if a.dtype.byteorder in _SWAP:
        return a.astype(a.dtype.newbyteorder("<"), order="C")
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


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
    obj = unpack_bounded(data, max_bytes=max_bytes, ext_hook=_ext_hook, error=WireError)
    _check_depth(obj)
    return obj


def unpack_bounded(
    data: bytes | bytearray | memoryview,
    *,
    max_bytes: int,
    ext_hook: Callable[[int, bytes], Any],
    error: type[Exception],
    max_items: int = MAX_ITEMS,
) -> Any:
    """msgpack-decode untrusted bytes with every length bounded by the message's own size
    (a few bytes cannot claim a huge string or container), at most `max_items` container
    items in all (decoding stops as the budget runs out) and maps keyed by strings;
    `error(text)` raised for anything wrong (an `error` raised by `ext_hook` passes)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise error(f"expected bytes, got {type(data).__name__}")
    size = memoryview(data).nbytes
    if size > max_bytes:
        raise error(f"message of {size} bytes exceeds the limit of {max_bytes} bytes")
    budget = _Budget(max_items, error)
    try:
        return msgpack.unpackb(
            data,
            ext_hook=ext_hook,
            list_hook=budget.spend,
            object_hook=budget.spend,
            raw=False,
            strict_map_key=True,
            max_str_len=min(size, MAX_STR_LEN),
            max_bin_len=size,
            max_ext_len=size,
            max_array_len=min(size, MAX_CONTAINER_LEN),
            max_map_len=min(size, MAX_CONTAINER_LEN),
        )
    except error:
        raise
    except msgpack.ExtraData:
        raise error("trailing bytes after the message") from None
    except msgpack.StackError:
        raise error(f"nesting deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as err:
        raise error(f"string is not valid UTF-8: {err.reason}") from None
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        text = str(err) or "bad format byte"
        if "incomplete" in text:
            text = "truncated message (incomplete input)"
        raise error(f"not a valid msgpack message: {text}") from None


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(ARRAY_EXT, _encode_array(obj))
    if isinstance(obj, np.bool_ | np.integer | np.floating):
        return obj.item()
    raise WireError(f"cannot pack object of type {type(obj).__module__}.{type(obj).__name__}")


def check_travels(a: np.ndarray) -> str:
    """The wire name of `a`'s dtype; WireError if the array cannot travel."""
    name = wire_name(a.dtype)
    if name is None:
        raise WireError(
            f"cannot pack array of dtype {a.dtype.str!r} ({a.dtype.name}): only bool, int8..64, "
            "uint8..64 and float16/32/64 travel"
        )
    if a.ndim > MAX_NDIM:
        raise WireError(f"cannot pack array of {a.ndim} dimensions (at most {MAX_NDIM})")
    return name


def _encode_array(a: np.ndarray) -> bytes:
    dtype = a.dtype
    raw = _RAW_BY_KIND.get((dtype.kind, dtype.itemsize))
    ndim = a.ndim
    if raw is None or ndim > MAX_NDIM:
        check_travels(a)  # raises, naming why
    if dtype.byteorder in _SWAP or not a.flags.c_contiguous:
        a = as_wire(a)
    # One struct for the name, ndim and axes; tobytes: the elements, C order (a small copy:
    # inline arrays are below framed.MIN_OUT_OF_BAND bytes, larger ones are lent as frames).
    return INLINE_HEADS[ndim].pack(raw, ndim, *a.shape) + a.tobytes()


class _Budget:
    """Counts the items of the containers msgpack builds (each handed over once it is
    complete) and stops the decode when they pass the budget."""

    __slots__ = ("error", "left", "limit")

    def __init__(self, limit: int, error: type[Exception]) -> None:
        self.left = self.limit = limit
        self.error = error

    def spend(self, container: Any) -> Any:
        self.left -= 1 + len(container)
        if self.left < 0:
            raise self.error(f"more than {self.limit} items in the message's containers")
        return container


def _ext_hook(code: int, data: bytes) -> np.ndarray:
    if code != ARRAY_EXT:
        raise WireError(f"unknown msgpack extension type {code} (only {ARRAY_EXT}: ndarray)")
    length = len(data)
    if length < _HEAD.size:
        raise WireError(f"ndarray header truncated: {length} bytes, need {_HEAD.size}")
    raw_name, ndim = _HEAD.unpack_from(data, 0)
    dtype = _BY_RAW.get(raw_name)
    if dtype is None:
        raise WireError(
            f"ndarray dtype {raw_text(raw_name)!r} not allowed (bool, int8..64, uint8..64, "
            "float16/32/64 only)"
        )
    if ndim > MAX_NDIM:
        raise WireError(f"ndarray has {ndim} dimensions (at most {MAX_NDIM})")
    offset = _HEAD.size + _DIM.size * ndim
    if length < offset:
        raise WireError(f"ndarray shape truncated: {length} bytes, need {offset}")
    shape = SHAPES[ndim].unpack_from(data, _HEAD.size)
    expected = math.prod(shape) * dtype.itemsize  # Python ints: a huge shape cannot overflow
    if length - offset != expected:
        raise WireError(
            f"ndarray {dtype}{list(shape)} needs {expected} data bytes, got {length - offset}"
        )
    out = np.frombuffer(data, dtype=dtype, offset=offset)
    if ndim != 1:
        out = out.reshape(shape)
    # A bool byte other than 0/1 makes numpy misbehave (True != True); refuse it.
    if dtype is _BOOL and out.size and out.view(np.uint8).max() > 1:
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
