"""robotd's framed messages (protocol 2): a msgpack header frame, then the raw bytes of each
large array as a ZeroMQ frame of its own, so that no array is ever copied into a body.
Never pickle.

Contract:
- `pack(obj)` -> `[header, *buffers]`. The header is msgpack of the same types
  `robotd.wire.packb` takes, with arrays below MIN_OUT_OF_BAND bytes inside it (extension
  type 1, as in robotd.wire) and every larger array as extension type 2, which names the
  array's dtype, its frame and its shape; that frame is the array's bytes (C order,
  little-endian): a memoryview of the array, not a copy. An array that is a whole zmq.Frame
  received earlier (as `unpack` makes them) is passed on as that very Frame, so forwarding
  it copies nothing. Send the frames with `copy=False`. A message without large arrays is
  one frame: then it is exactly a protocol-1 message (robotd.wire).
- `unpack(frames, into)` -> the message, arrays as read-only zero-copy views of their frames
  (or of the header, for extension type 1). `into` a msgspec type: decoded straight into it
  and validated (FieldError naming the field); check its free-form parts (`Any`) with
  `check_tree`. Without `into`, the whole message is checked so.
- Every problem raises WireError naming it: no frames, more than MAX_FRAMES, a header over
  MAX_HEADER_BYTES (when there are array frames; strings are bounded by it, and lists and
  maps to robotd.wire's MAX_CONTAINER_LEN entries), a total over `max_bytes`, bad msgpack,
  trailing bytes, an unknown extension, a dtype that does not travel, more than 32
  dimensions, a frame index out of range or referenced twice, a frame whose size disagrees
  with its dtype and shape, a frame referenced by nothing, a bool byte other than 0 or 1,
  nesting deeper than 32 levels, a map key that is not a string.

Extension type 2 payload, little-endian: bytes 0..7 dtype name (NUL-padded ASCII, as type
1), 8..15 frame index (uint64; 1 is the first frame after the header), 16..23 ndim (uint64,
at most 32), then ndim uint64 axes.
"""

from __future__ import annotations

import math
import re
import struct
import threading
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import zmq

from robotd import wire
from robotd.wire import WireError

__all__ = ["FieldError", "WireError", "check_tree", "pack", "unpack"]

OUT_OF_BAND_EXT = 2
MIN_OUT_OF_BAND = 4096  # smaller arrays ride inside the header: a frame costs more than that
MAX_FRAMES = 1 + 1024  # the header and at most 1024 arrays
MAX_HEADER_BYTES = 16 << 20  # when arrays travel as frames, the header holds no bulk
# A socket's copy_threshold: sent with copy=False, frames below it are copied into ZeroMQ's
# message and larger ones lent to it. Lending costs pyzmq a hand-over to its garbage
# collector thread once ZeroMQ is done with the buffer: slower than copying a 224 x 224
# camera frame (measured for bench/openpi.py), cheaper for a 1080p one. Frames received
# from ZeroMQ and passed on are shared by reference whatever their size.
COPY_BELOW = 512 << 10
_HEAD = struct.Struct("<8sQQ")
_DIM = struct.Struct("<Q")
_OOB_HEADS = [struct.Struct(f"<8sQQ{n}Q") for n in range(wire.MAX_NDIM + 1)]  # by ndim

Buffer = bytes | memoryview | zmq.Frame


class FieldError(WireError):
    """A header that decodes but does not fit the type asked for: `field` is the path
    ("steps[2]", "inline[0].step"; "" for the message itself), `reason` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"field '{field}': {reason}" if field else reason)
        self.field = field
        self.reason = reason


# ---- packing ------------------------------------------------------------------------------


def pack(obj: Any, *, min_out_of_band: int = MIN_OUT_OF_BAND) -> list[Buffer]:
    """`obj` as frames `[header, *array buffers]`; WireError if it cannot travel."""
    packing = _packing
    packing.parts = parts = []
    packing.min_out_of_band = min_out_of_band
    try:
        header = packing.encoder.encode(obj)
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as err:
        raise WireError(f"cannot pack: {err}") from None
    finally:
        packing.parts = []  # the arrays are the caller's now, not this thread's
    return [header, *parts]


class _Packing(threading.local):
    """This thread's encoder (built once: building one costs as much as a small message)
    and the frames of the message it is packing (appended to by its hook)."""

    def __init__(self) -> None:
        self.parts: list[Buffer] = []
        self.min_out_of_band = MIN_OUT_OF_BAND
        self.encoder = msgspec.msgpack.Encoder(enc_hook=self._hook)

    def _hook(self, value: Any) -> Any:
        if isinstance(value, np.ndarray):
            if value.nbytes >= self.min_out_of_band:
                return _out_of_band(value, self.parts)
            return msgspec.msgpack.Ext(wire.ARRAY_EXT, wire._encode_array(value))
        return wire._default(value)  # numpy scalars, or WireError naming the type


_packing = _Packing()


def _out_of_band(a: np.ndarray, parts: list[Buffer]) -> msgspec.msgpack.Ext:
    dtype = a.dtype
    raw = wire.RAW_BY_KIND.get((dtype.kind, dtype.itemsize))
    if raw is None or a.ndim > wire.MAX_NDIM:
        wire.check_travels(a)  # raises, naming why
    a = wire.as_wire(a)  # no copy for native C-order arrays
    frame = _whole_frame(a) if a.base is not None else None
    if frame is None:  # (a memoryview cannot cast an empty array's view: reshape first)
        frame = memoryview(a).cast("B") if a.size else a.reshape(-1).data.cast("B")
    parts.append(frame)
    head = _OOB_HEADS[a.ndim].pack(raw, len(parts), a.ndim, *a.shape)
    return msgspec.msgpack.Ext(OUT_OF_BAND_EXT, head)


def _whole_frame(a: np.ndarray) -> zmq.Frame | None:
    """The received zmq.Frame that C-contiguous `a` views entirely, if it does (a view as
    long as its frame can only start where the frame does)."""
    base = a.base
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, zmq.Frame) and a.nbytes == len(base):
        return base
    return None


# ---- unpacking ----------------------------------------------------------------------------


class _Frames(threading.local):
    """The frames of the message being decoded on this thread (read by the ext hook)."""

    frames: Sequence[Any] = ()
    seen: bytearray = bytearray()


_current = _Frames()
_decoders: dict[Any, msgspec.msgpack.Decoder] = {}


def unpack(
    frames: Sequence[Buffer], into: Any = None, *, max_bytes: int = wire.MAX_MESSAGE_BYTES
) -> Any:
    """The message in `frames` (see the module docstring); WireError naming the problem."""
    n = len(frames)
    if n == 0:
        raise WireError("empty message: no frames")
    if n > MAX_FRAMES:
        raise WireError(f"{n} frames, at most {MAX_FRAMES} (a header and {MAX_FRAMES - 1} arrays)")
    try:
        sizes = [_size(f) for f in frames]
    except TypeError as err:
        raise WireError(f"a frame is not bytes: {err}") from None
    if n > 1 and sizes[0] > MAX_HEADER_BYTES:
        raise WireError(f"header of {sizes[0]} bytes, over the limit of {MAX_HEADER_BYTES}")
    total = sum(sizes)
    if total > max_bytes:
        raise WireError(f"message of {total} bytes exceeds the limit of {max_bytes} bytes")
    decoder = _decoders.get(into)
    if decoder is None:
        decoder = _decoders[into] = msgspec.msgpack.Decoder(
            Any if into is None else into, ext_hook=_ext_hook
        )
    _current.frames, _current.seen = frames, bytearray(n)
    try:
        obj = decoder.decode(frames[0])
    except WireError:
        raise
    except msgspec.ValidationError as err:
        raise field_error(str(err)) from None
    except msgspec.DecodeError as err:
        text = str(err)
        if "truncated" in text:
            text = "truncated message (incomplete input)"
        raise WireError(f"not a valid msgpack message: {text}") from None
    except RecursionError:
        raise WireError(f"nesting deeper than {wire.MAX_DEPTH} levels") from None
    except (ValueError, TypeError, OverflowError) as err:  # numpy refusing a shape
        raise WireError(f"not a valid message: {err}") from None
    finally:
        seen, _current.frames, _current.seen = _current.seen, (), bytearray()
    if seen.count(1) != n - 1:
        unused = next(i for i in range(1, n) if not seen[i])
        raise WireError(f"frame {unused} of {n - 1} array frames is referenced by no array")
    if into is None:
        check_tree(obj)
    return obj


def _size(frame: Any) -> int:
    """A frame's length in bytes (len() is that for these, and cheaper than a memoryview)."""
    kind = type(frame)
    if kind is bytes or kind is bytearray or kind is zmq.Frame:
        return len(frame)
    if kind is np.ndarray:
        return frame.nbytes
    return memoryview(frame).nbytes


def _ext_hook(code: int, data: memoryview) -> np.ndarray:
    if code != OUT_OF_BAND_EXT:
        inline = wire._ext_hook(code, data)  # type 1; WireError for any other
        inline.setflags(write=False)  # a view of the header, which may be a writable frame
        return inline
    length = len(data)
    if length < _HEAD.size:
        raise WireError(f"array frame reference truncated: {length} bytes, need {_HEAD.size}")
    raw_name, index, ndim = _HEAD.unpack_from(data, 0)
    dtype = wire.BY_RAW.get(raw_name)
    if dtype is None:
        raise WireError(
            f"array dtype {wire.raw_text(raw_name)!r} not allowed (bool, int8..64, uint8..64, "
            "float16/32/64 only)"
        )
    if ndim > wire.MAX_NDIM:
        raise WireError(f"array has {ndim} dimensions (at most {wire.MAX_NDIM})")
    if length != _HEAD.size + _DIM.size * ndim:
        raise WireError(
            f"array frame reference of {length} bytes, need {_HEAD.size + _DIM.size * ndim}"
        )
    shape = wire.SHAPES[ndim].unpack_from(data, _HEAD.size)
    current = _current
    frames, seen = current.frames, current.seen
    if not 0 < index < len(frames):
        raise WireError(
            f"array {dtype}{list(shape)} refers to frame {index}, but the message has "
            f"{len(frames) - 1} array frames"
        )
    if seen[index]:
        raise WireError(f"frame {index} is referenced by two arrays")
    seen[index] = 1
    frame = frames[index]
    size = _size(frame)
    expected = math.prod(shape) * dtype.itemsize  # Python ints: a huge shape cannot overflow
    if size != expected:
        raise WireError(
            f"array {dtype}{list(shape)} needs {expected} bytes, its frame {index} has {size}"
        )
    out = np.frombuffer(frame, dtype=dtype).reshape(shape) if size else np.empty(shape, dtype)
    out.setflags(write=False)
    if dtype is wire.BOOL and out.size and out.view(np.uint8).max() > 1:
        raise WireError(f"array bool{list(shape)} holds bytes other than 0 and 1")
    return out


def check_tree(obj: Any, where: str = "message") -> None:
    """Free-form decoded values: at most MAX_DEPTH levels of lists and maps of at most
    MAX_CONTAINER_LEN entries, map keys strings (or bytes). WireError naming the problem;
    no recursion (hostile input). (Strings are bounded by the header's size.)"""
    if type(obj) is not list and type(obj) is not dict:
        return
    level, depth = [obj], 1
    while level:
        if depth > wire.MAX_DEPTH:
            raise WireError(f"{where}: nesting deeper than {wire.MAX_DEPTH} levels")
        below: list[Any] = []
        for node in level:
            if len(node) > wire.MAX_CONTAINER_LEN:
                raise WireError(f"{where}: {len(node)} entries (at most {wire.MAX_CONTAINER_LEN})")
            if type(node) is dict:
                for key, value in node.items():
                    if type(key) is not str and type(key) is not bytes:
                        raise WireError(f"{where}: map key {key!r:.40} is not a string")
                    if type(value) is dict or type(value) is list:
                        below.append(value)
            else:
                below.extend(v for v in node if type(v) is dict or type(v) is list)
        level, depth = below, depth + 1


_AT = re.compile(r" - at `(?:key` in `)?\$([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]*)`")


def field_error(text: str) -> FieldError:
    """msgspec's validation message as a FieldError: "Expected `int` >= 0 - at `$.step`"
    is field 'step', reason "expected int >= 0"."""
    found = _AT.search(text)
    path = found.group(1).lstrip(".") if found else ""
    reason = text[: found.start()] if found else text
    reason = reason[:1].lower() + reason[1:]
    missing = _MISSING.match(text)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        reason = "missing"
    elif "`key` in" in text:
        reason = f"map key: {reason}"
    return FieldError(path, reason.replace("`", ""))
