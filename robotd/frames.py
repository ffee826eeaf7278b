"""Camera frames: fit them to a declared `Camera` spec, encode them for the wire, decode them.

A pure module (no I/O, no state). The robot side fits and encodes, the worker decodes:

    enc = fit_and_encode(frame, cam, name="wrist")   # robot: HWC uint8 RGB in
    msg = to_wire(enc)                               # {"codec", "shape", "data"}, msgpack-able
    img = decode(msg, cam.layout, name="wrist")      # worker: HWC uint8 or CHW float32 0..1

Contract:
- Frames are HWC uint8 RGB, channels last, 3 channels, at least 1x1. Anything else given to
  `fit` / `encode` raises `FrameError` naming the camera and the shape and dtype received.
- `fit` resizes with cv2 (stretch; crop = scale to cover, keep the centre; pad = scale to fit,
  letterbox with zeros, centred). No spec or no width/height: the frame unchanged.
- `encode`: codec None or "raw" sends the pixels as they are; "jpeg" at the spec's quality;
  "png" at a fixed, fast compression level. cv2 works in BGR, so colours are swapped around
  imencode / imdecode: what goes in as RGB comes out as RGB.
- `decode` treats its message as untrusted: every problem (not a mapping, unknown codec, bad
  shape, wrong data type, corrupt or truncated bytes, a decoded size other than the declared
  one, a raw buffer of the wrong size) raises `FrameError` naming the camera and the problem.
  The image size in a JPEG / PNG header is checked against the declared shape *before*
  decoding, so a small message cannot make the worker allocate a huge image.
- Raw frames decoded to hwc_uint8 are returned zero-copy, so they may be read-only (as
  `robotd.wire` hands arrays out); `.copy()` one to modify it. Other results are fresh arrays.
- The cv2 calls (resize, cvtColor, imencode, imdecode) release the GIL: encoding and
  decoding can run in worker threads alongside the event loop.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from robotd.contract import MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, Camera

CODECS = ("jpeg", "png", "raw")
LAYOUTS = ("hwc_uint8", "chw_float")
PNG_COMPRESSION = 1  # zlib level 1: frames are encoded per tick, speed beats size
_FILTERS = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC}
_WIRE_KEYS = frozenset({"codec", "shape", "data"})
# Ignore EXIF orientation: a rotated decode would silently disagree with the declared shape.
_IMREAD = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic...); C4, C8 and CC
# share the range but are tables, not frames.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RSTn carry no segment


class FrameError(ValueError):
    """A camera frame or frame message is unusable. The message names the camera and the
    problem; `camera` and `problem` hold them apart."""

    def __init__(self, problem: str, camera: str = "") -> None:
        self.camera = camera
        self.problem = problem
        where = f"camera {camera!r}" if camera else "camera"
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True, eq=False)  # eq=False: comparing ndarray fields is ambiguous
class Encoded:
    """One encoded frame. `data` is bytes for jpeg/png, the HWC uint8 array for raw;
    `shape` is the frame's (height, width, 3)."""

    codec: str
    data: bytes | np.ndarray
    shape: tuple[int, int, int]

    def nbytes(self) -> int:
        """Payload size in bytes (what the frame costs on the wire, headers aside)."""
        return self.data.nbytes if isinstance(self.data, np.ndarray) else len(self.data)


def _describe(frame: Any) -> str:
    if isinstance(frame, np.ndarray):
        return f"shape {frame.shape} dtype {frame.dtype}"
    return f"a {type(frame).__name__}"


def _check_frame(frame: Any, name: str) -> np.ndarray:
    """The frame as a C-contiguous HWC uint8 array, or FrameError."""
    ok = (
        isinstance(frame, np.ndarray)
        and frame.ndim == 3
        and frame.shape[2] == 3
        and frame.dtype == np.uint8
        and frame.size > 0
    )
    if not ok:
        raise FrameError(
            f"frame must be a non-empty HWC uint8 RGB array (H, W, 3); got {_describe(frame)}",
            name,
        )
    return np.ascontiguousarray(frame)


def fit(frame: np.ndarray, cam: Camera | None, *, name: str = "") -> np.ndarray:
    """`frame` (HWC uint8 RGB) fitted to `cam`'s width/height, resize mode and filter, as a
    C-contiguous HWC uint8 array. `cam` None or without width/height: the frame unchanged
    (made C-contiguous). Raises FrameError for a frame that is not HWC uint8 RGB."""
    frame = _check_frame(frame, name)
    if cam is None or cam.width is None or cam.height is None:
        return frame
    w, h = cam.width, cam.height
    src_h, src_w = frame.shape[:2]
    if (src_w, src_h) == (w, h):
        return frame
    interp = _FILTERS[cam.filter]
    if cam.resize == "stretch":
        return cv2.resize(frame, (w, h), interpolation=interp)
    if cam.resize == "crop":
        return _crop(frame, w, h, interp)
    return _pad(frame, w, h, interp)


def _crop(frame: np.ndarray, w: int, h: int, interp: int) -> np.ndarray:
    """Scale to cover (w, h) and keep the centre. The crop is taken in source pixels first,
    so only the kept region is resampled."""
    src_h, src_w = frame.shape[:2]
    scale = max(w / src_w, h / src_h)
    keep_w = min(src_w, max(1, round(w / scale)))
    keep_h = min(src_h, max(1, round(h / scale)))
    x0, y0 = (src_w - keep_w) // 2, (src_h - keep_h) // 2
    region = frame[y0 : y0 + keep_h, x0 : x0 + keep_w]
    if region.shape[:2] == (h, w):
        return np.ascontiguousarray(region)
    return cv2.resize(region, (w, h), interpolation=interp)


def _pad(frame: np.ndarray, w: int, h: int, interp: int) -> np.ndarray:
    """Scale to fit inside (w, h) and letterbox with zeros, centred: the sizes and offsets of
    tf.image.resize_with_pad, as openpi-client's image_tools.resize_with_pad computes them
    (truncated, not rounded), so a policy trained on those frames sees its content in the
    very same pixels."""
    src_h, src_w = frame.shape[:2]
    ratio = max(src_w / w, src_h / h)
    new_w = min(w, max(1, int(src_w / ratio)))
    new_h = min(h, max(1, int(src_h / ratio)))
    inner = (
        frame
        if (new_w, new_h) == (src_w, src_h)
        else cv2.resize(frame, (new_w, new_h), interpolation=interp)
    )
    out = np.zeros((h, w, 3), dtype=np.uint8)
    x0, y0 = (w - new_w) // 2, (h - new_h) // 2
    out[y0 : y0 + new_h, x0 : x0 + new_w] = inner
    return out


def encode(frame: np.ndarray, cam: Camera | None, *, name: str = "") -> Encoded:
    """Encode an HWC uint8 RGB frame with `cam`'s codec (None or no spec: "raw", as captured;
    jpeg at `cam.quality`; png at PNG_COMPRESSION). Does not resize: see `fit_and_encode`.
    Raises FrameError for a bad frame or an encoder failure."""
    frame = _check_frame(frame, name)
    shape = (int(frame.shape[0]), int(frame.shape[1]), 3)
    if cam is None or cam.codec is None or cam.codec == "raw":
        return Encoded("raw", frame, shape)
    codec = cam.codec
    if codec == "jpeg":
        ext, params = ".jpg", [cv2.IMWRITE_JPEG_QUALITY, int(cam.quality)]
    elif codec == "png":
        ext, params = ".png", [cv2.IMWRITE_PNG_COMPRESSION, PNG_COMPRESSION]
    else:
        raise FrameError(f"unknown codec {codec!r} (expected one of {', '.join(CODECS)})", name)
    bgr = cv2.cvtColor(frame, cv2.COLOR_RGB2BGR)
    try:
        ok, buf = cv2.imencode(ext, bgr, params)
    except cv2.error as err:
        raise FrameError(f"{codec} encoding of a {shape} frame failed: {err}", name) from None
    if not ok:
        raise FrameError(f"{codec} encoding of a {shape} frame failed", name)
    return Encoded(codec, buf.tobytes(), shape)


def fit_and_encode(frame: np.ndarray, cam: Camera | None, *, name: str = "") -> Encoded:
    """`encode(fit(frame, cam), cam)`: what the robot side sends for one camera frame."""
    return encode(fit(frame, cam, name=name), cam, name=name)


def to_wire(enc: Encoded) -> dict[str, Any]:
    """The message for `robotd.wire`: {"codec": str, "shape": [h, w, 3], "data": bytes or
    the HWC uint8 array (wire packs arrays)}."""
    return {"codec": enc.codec, "shape": list(enc.shape), "data": enc.data}


def decode(msg: Any, layout: str = "hwc_uint8", *, name: str = "") -> np.ndarray:
    """Decode an untrusted `to_wire` message into the policy's layout: "hwc_uint8" (HWC uint8
    RGB) or "chw_float" (CHW float32 in 0..1). Raises FrameError naming the camera and the
    problem for anything wrong with the message."""
    if layout not in LAYOUTS:
        raise FrameError(f"unknown layout {layout!r} (expected one of {', '.join(LAYOUTS)})", name)
    codec, shape, data = _check_message(msg, name)
    if codec == "raw":
        hwc = _decode_raw(data, shape, name)
    else:
        hwc = _decode_image(codec, data, shape, name)
    if layout == "hwc_uint8":
        return hwc
    chw = np.ascontiguousarray(hwc.transpose(2, 0, 1), dtype=np.float32)
    # Divide rather than multiply by 1/255: 255 then maps to exactly 1.0.
    return np.divide(chw, np.float32(255.0), out=chw)


def _check_message(msg: Any, name: str) -> tuple[str, tuple[int, int, int], Any]:
    """(codec, shape, data) from a frame message, each checked; FrameError otherwise."""
    if not isinstance(msg, Mapping):
        raise FrameError(f"frame message must be a mapping, got a {type(msg).__name__}", name)
    keys = set(msg)
    if keys != _WIRE_KEYS:
        missing = sorted(map(str, _WIRE_KEYS - keys))
        extra = sorted(map(repr, keys - _WIRE_KEYS))
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(extra)}"] if extra else []
        )
        raise FrameError(
            f"frame message keys: {'; '.join(parts)} (expected codec, shape, data)", name
        )
    codec = msg["codec"]
    if not isinstance(codec, str) or codec not in CODECS:
        raise FrameError(f"unknown codec {codec!r} (expected one of {', '.join(CODECS)})", name)
    return codec, _check_shape(msg["shape"], name), msg["data"]


def _check_shape(shape: Any, name: str) -> tuple[int, int, int]:
    ok = (
        isinstance(shape, list | tuple)
        and len(shape) == 3
        and all(isinstance(n, int | np.integer) and not isinstance(n, bool) for n in shape)
    )
    if not ok:
        raise FrameError(
            f"declared shape must be 3 integers [height, width, 3]; got {_short(shape)}", name
        )
    h, w, c = (int(n) for n in shape)
    if c != 3:
        raise FrameError(f"declared shape {[h, w, c]} has {c} channels (expected 3, RGB)", name)
    for side, n in (("height", h), ("width", w)):
        if not 1 <= n <= MAX_IMAGE_SIDE:
            raise FrameError(
                f"declared shape {[h, w, c]}: {side} {n} out of range "
                f"(must be 1..{MAX_IMAGE_SIDE})",
                name,
            )
    if h * w > MAX_IMAGE_PIXELS:
        raise FrameError(
            f"declared shape {[h, w, c]}: {h * w} pixels, over {MAX_IMAGE_PIXELS}", name
        )
    return h, w, c


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _decode_raw(data: Any, shape: tuple[int, int, int], name: str) -> np.ndarray:
    """Raw pixels: an HWC uint8 array of exactly `shape`, or bytes of exactly its size."""
    if isinstance(data, bytes | bytearray | memoryview):
        size = memoryview(data).nbytes
        if size != shape[0] * shape[1] * shape[2]:
            raise FrameError(
                f"raw frame of {size} bytes does not match the declared shape "
                f"{list(shape)} ({shape[0] * shape[1] * shape[2]} bytes)",
                name,
            )
        return np.frombuffer(data, dtype=np.uint8).reshape(shape)
    if not isinstance(data, np.ndarray):
        raise FrameError(
            f"raw frame data must be an array or bytes, got a {type(data).__name__}", name
        )
    if data.dtype != np.uint8:
        raise FrameError(f"raw frame has dtype {data.dtype} (expected uint8)", name)
    if data.shape != shape:
        raise FrameError(
            f"raw frame of shape {data.shape} does not match the declared shape {list(shape)}", name
        )
    return np.ascontiguousarray(data)


def _decode_image(codec: str, data: Any, shape: tuple[int, int, int], name: str) -> np.ndarray:
    """JPEG / PNG bytes to HWC uint8 RGB of exactly `shape`."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FrameError(f"{codec} frame data must be bytes, got a {type(data).__name__}", name)
    raw = data if isinstance(data, bytes) else bytes(data)
    buf = np.frombuffer(raw, dtype=np.uint8)
    size = _jpeg_size(raw) if codec == "jpeg" else _png_size(raw)
    if size is None:
        raise FrameError(f"corrupt {codec} data ({buf.size} bytes): no valid image header", name)
    if size != shape[:2]:
        raise FrameError(
            f"{codec} header says {size[0]}x{size[1]} (HxW) but the declared "
            f"shape is {list(shape)}",
            name,
        )
    try:
        bgr = cv2.imdecode(buf, _IMREAD)
    except cv2.error as err:
        raise FrameError(f"corrupt {codec} data ({buf.size} bytes): {err}", name) from None
    if bgr is None:
        raise FrameError(f"corrupt or truncated {codec} data ({buf.size} bytes)", name)
    if bgr.shape != shape:
        raise FrameError(
            f"decoded {codec} frame has shape {bgr.shape}, declared {list(shape)}", name
        )
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _png_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a PNG's IHDR chunk, or None if there is none where it must be."""
    head = data[:24]
    if len(head) < 24 or not head.startswith(_PNG_MAGIC) or head[12:16] != b"IHDR":
        return None
    w, h = struct.unpack(">II", head[16:24])
    return h, w


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a JPEG's start-of-frame segment, walking the segments that
    precede it; None if the stream ends, breaks or reaches the scan first."""
    if not data.startswith(b"\xff\xd8"):
        return None
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if marker in _JPEG_NO_LENGTH:
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame
            return None
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            return None
        if marker in _JPEG_SOF:
            if i + 9 > len(data):
                return None
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return h, w
        i += 2 + length
    return None
