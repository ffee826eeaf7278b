"""openpi's wire format: msgpack with numpy values as maps (openpi-client's msgpack_numpy).

Encoding, as openpi packs it:
    ndarray -> {b"__ndarray__": True, b"data": <C-order bytes>, b"dtype": "<f4", b"shape": [..]}
    numpy scalar -> {b"__npgeneric__": True, b"data": <Python scalar>, b"dtype": "<f4"}
(the four keys are msgpack bin, the dtype is numpy's `dtype.str`, byte order included).

Contract:
- `Encoder().encode(obj)` / `packb(obj)` take None, bool, int, float, str, bytes, lists,
  tuples, dicts with str or bytes keys, numpy arrays and scalars of a plain numeric dtype
  (bool, int8..64, uint8..64, float16/32/64; any byte order, any strides). Object,
  structured, sub-array, complex, string and datetime dtypes are refused (CodecError naming
  where in the message), as openpi refuses object and complex ones.
- `unpackb(data)` returns the message with every array map as a fresh, writable,
  C-contiguous ndarray (openpi hands out read-only views of the received bytes; robotd
  copies) and every scalar map as a numpy scalar. Untrusted input is bounded: message size,
  string, bin and container lengths, nesting depth MAX_DEPTH, ndim MAX_NDIM. No extension
  types (msgpack timestamps included). Maps keep their keys as sent (str or bytes). Every
  problem raises CodecError naming it and where (`at actions`, `at images.cam_high`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgpack
import numpy as np

from robotd.link.openpi.errors import CodecError
from robotd.wire import unpack_bounded

MAX_MESSAGE_BYTES = 1 << 30
MAX_DEPTH = 32  # containers inside containers (an array map counts as a level)
MAX_NDIM = 32

_ARRAY_KEYS = frozenset({b"__ndarray__", b"data", b"dtype", b"shape"})
_SCALAR_KEYS = frozenset({b"__npgeneric__", b"data", b"dtype"})
# numpy dtype.str of the plain numeric dtypes: byte order, kind, item size. Anything else
# (object, void/structured, sub-array, complex, strings, datetimes, float128) is refused
# before numpy parses it.
_DTYPE_STR = re.compile(r"[<>|=]?(?:b1|[iu][1248]|f[248])")
_KINDS = frozenset("biuf")
_LEAVES = (str, bytes, int, float, bool, type(None), np.ndarray, np.generic)


def _where(path: tuple[Any, ...]) -> str:
    if not path:
        return "at the top level"
    parts = [p.decode("utf-8", "replace") if isinstance(p, bytes) else str(p) for p in path]
    text = ".".join(parts)
    return f"at {text[:120]}"


def _refuse_dtype(dtype: np.dtype) -> bool:
    return dtype.kind not in _KINDS or dtype.fields is not None or dtype.subdtype is not None


def _default(obj: Any) -> Any:
    """msgpack's hook for what it cannot pack itself: numpy arrays and scalars."""
    if isinstance(obj, np.ndarray):
        if _refuse_dtype(obj.dtype):
            raise CodecError(f"cannot encode an array of dtype {obj.dtype.str!r} ({obj.dtype})")
        if obj.ndim > MAX_NDIM:
            raise CodecError(f"cannot encode an array of {obj.ndim} dimensions (max {MAX_NDIM})")
        # A C-contiguous array is packed from its own buffer (no tobytes() copy).
        data = obj.data if obj.flags.c_contiguous else np.ascontiguousarray(obj).data
        return {b"__ndarray__": True, b"data": data, b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        if _refuse_dtype(obj.dtype):
            raise CodecError(f"cannot encode a numpy scalar of dtype {obj.dtype.str!r}")
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise CodecError(f"cannot encode an object of type {type(obj).__module__}.{type(obj).__name__}")


def _find_unencodable(obj: Any, path: tuple[Any, ...] = (), depth: int = 0) -> str:
    """Where in `obj` the first value that cannot be encoded sits (for the error message)."""
    if depth > MAX_DEPTH:
        return f"{_where(path)}: nesting deeper than {MAX_DEPTH} levels"
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str | bytes):
                return f"{_where(path)}: map key {k!r:.40} is not str or bytes"
            found = _find_unencodable(v, (*path, k), depth + 1)
            if found:
                return found
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            found = _find_unencodable(v, (*path, i), depth + 1)
            if found:
                return found
    elif isinstance(obj, int) and not isinstance(obj, bool) and not -(1 << 63) <= obj < 1 << 64:
        return f"{_where(path)}: integer {obj} does not fit in 64 bits"
    elif isinstance(obj, np.ndarray | np.generic):
        try:
            _default(obj)
        except CodecError as exc:
            return f"{_where(path)}: {exc}"
    elif not isinstance(obj, _LEAVES):
        return f"{_where(path)}: cannot encode an object of type {type(obj).__name__}"
    return ""


class Encoder:
    """Encodes messages with one reusable msgpack Packer. Not thread-safe: one per user."""

    def __init__(self) -> None:
        self._packer = msgpack.Packer(default=_default, use_bin_type=True, autoreset=True)

    def encode(self, obj: Any) -> bytes:
        """`obj` as openpi msgpack bytes; CodecError naming where the unencodable value is."""
        try:
            return self._packer.pack(obj)
        except (CodecError, TypeError, ValueError, OverflowError) as exc:
            self._packer.reset()
            where = _find_unencodable(obj)
            raise CodecError(where or f"cannot encode: {exc}") from None


def packb(obj: Any) -> bytes:
    """One message as openpi msgpack bytes (a fresh Encoder; reuse one when sending many)."""
    return Encoder().encode(obj)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise CodecError(f"msgpack extension type {code} is not part of openpi's format")


def unpackb(data: bytes | bytearray | memoryview, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Decode one untrusted message (see the module contract); CodecError for any problem."""
    obj = unpack_bounded(data, max_bytes=max_bytes, ext_hook=_refuse_ext, error=CodecError)
    return _convert(obj, (), 0)


def _convert(obj: Any, path: tuple[Any, ...], depth: int) -> Any:
    """Check types and depth, turn array and scalar maps into numpy values (recursion is
    bounded: the depth is checked before going down)."""
    kind = type(obj)
    if kind is dict:
        if depth >= MAX_DEPTH:
            raise CodecError(f"{_where(path)}: nesting deeper than {MAX_DEPTH} levels")
        if b"__ndarray__" in obj:
            return _array(obj, path)
        if b"__npgeneric__" in obj:
            return _scalar(obj, path)
        for k, v in obj.items():
            t = type(v)
            if t is dict or t is list or not isinstance(v, _LEAVES):
                obj[k] = _convert(v, (*path, k), depth + 1)
        return obj
    if kind is list:
        if depth >= MAX_DEPTH:
            raise CodecError(f"{_where(path)}: nesting deeper than {MAX_DEPTH} levels")
        for i, v in enumerate(obj):
            t = type(v)
            if t is dict or t is list or not isinstance(v, _LEAVES):
                obj[i] = _convert(v, (*path, i), depth + 1)
        return obj
    if isinstance(obj, _LEAVES):
        return obj
    raise CodecError(f"{_where(path)}: a {kind.__name__} is not part of openpi's format")


def _dtype(value: Any, path: tuple[Any, ...]) -> np.dtype:
    if not isinstance(value, str) or not _DTYPE_STR.fullmatch(value):
        raise CodecError(
            f"{_where(path)}: dtype {value!r:.40} not allowed (bool, int8..64, uint8..64, "
            "float16/32/64 only)"
        )
    return np.dtype(value)


def _check_keys(obj: dict, expected: frozenset[bytes], what: str, path: tuple[Any, ...]) -> None:
    keys = set(obj)
    if keys != expected:
        missing = sorted(k.decode() for k in expected - keys)
        extra = sorted(repr(k)[:40] for k in keys - expected)
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unexpected {', '.join(extra)}"] if extra else []
        )
        raise CodecError(f"{_where(path)}: {what} map keys: {'; '.join(parts)}")


def _array(obj: dict, path: tuple[Any, ...]) -> np.ndarray:
    _check_keys(obj, _ARRAY_KEYS, "ndarray", path)
    if obj[b"__ndarray__"] is not True:
        raise CodecError(f"{_where(path)}: __ndarray__ must be true")
    dtype = _dtype(obj[b"dtype"], path)
    shape = obj[b"shape"]
    ok = (
        type(shape) is list
        and len(shape) <= MAX_NDIM
        and all(type(n) is int and n >= 0 for n in shape)
    )
    if not ok:
        raise CodecError(
            f"{_where(path)}: ndarray shape must be a list of at most {MAX_NDIM} "
            f"non-negative integers, got {shape!r:.60}"
        )
    data = obj[b"data"]
    if type(data) is not bytes:
        raise CodecError(f"{_where(path)}: ndarray data must be bin, got a {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize  # Python ints: a huge shape cannot overflow
    if len(data) != expected:
        raise CodecError(
            f"{_where(path)}: ndarray {dtype.str}{shape} needs {expected} data bytes, "
            f"got {len(data)}"
        )
    out = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    # A bool byte other than 0/1 makes numpy misbehave (True != True); refuse it.
    if dtype.kind == "b" and out.size and out.view(np.uint8).max() > 1:
        raise CodecError(f"{_where(path)}: ndarray bool{shape} holds bytes other than 0 and 1")
    return out


def _scalar(obj: dict, path: tuple[Any, ...]) -> np.generic:
    _check_keys(obj, _SCALAR_KEYS, "npgeneric", path)
    if obj[b"__npgeneric__"] is not True:
        raise CodecError(f"{_where(path)}: __npgeneric__ must be true")
    dtype = _dtype(obj[b"dtype"], path)
    value = obj[b"data"]
    if dtype.kind == "b":
        ok = type(value) is bool
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        ok = type(value) is int and info.min <= value <= info.max
    else:
        ok = type(value) in (int, float) and (
            not math.isfinite(value) or abs(value) <= float(np.finfo(dtype).max)
        )
    if not ok:
        raise CodecError(f"{_where(path)}: npgeneric {value!r:.40} is not a {dtype} value")
    return dtype.type(value)
