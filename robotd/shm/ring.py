"""FrameRing: the camera → robot path, one writer (the camera process), any number of
readers, no locks.

Layout of the segment (all integers native-endian):
    0        header (64 bytes): magic, version, height, width, channels, slots, head
    64       the index: one 64-byte record per slot (seq, frame index, capture time)
    pixels   (page-aligned) one slot of height × width × channels bytes per slot

The index sits apart from the pixels so that a reader that only wants the newest frame's
reference (the control lane, every tick) maps the first page or two and never the pixels:
`FrameRing.attach(name, pixels=False)`.

Each slot's record carries a sequence counter (seqlock): odd while the writer fills the
slot, even once published. A reader reads the counter, the slot, then the counter again;
any change means the slot was being overwritten and the read is refused rather than
returned torn.

Memory ordering: the counters are aligned 8-byte stores and loads. x86-64 keeps stores
(and loads) in program order, which is all a seqlock needs; on weakly ordered CPUs (ARM)
the interpreter's own atomic operations between statements act as barriers in practice,
but no explicit fence is issued.
"""

from __future__ import annotations

import mmap

import numpy as np
from numpy.lib.stride_tricks import as_strided

from robotd.shm.segment import (
    ShmError,
    attach_segment,
    create_segment,
    release_mmap,
    round_up,
    unlink_segment,
)

_RING_MAGIC = b"RBTDRNG2"
_RING_VERSION = 2
_HEADER = 64
_OFF_HEAD = 32
_RECORD = 64  # per slot: seq u64, frame index u64, capture time i64, padding
_PAGE = 4096
_NO_FRAME = np.iinfo(np.uint64).max  # frame index of a slot that holds no valid frame
_LATEST_TRIES = 4

_RING_HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "=u4"),
        ("h", "=u4"),
        ("w", "=u4"),
        ("c", "=u4"),
        ("slots", "=u4"),
        ("pad", "=u4"),
        ("head", "=u8"),
    ]
)


def ring_slots(fps: float, budget_s: float, minimum: int = 4) -> int:
    """Slots a ring needs to keep `budget_s` seconds of frames at `fps` (at least `minimum`)."""
    if not (fps > 0 and budget_s >= 0):
        raise ValueError(f"ring_slots: fps must be > 0 and budget_s >= 0, got {fps}, {budget_s}")
    return max(minimum, int(np.ceil(fps * budget_s)) + 1)


MAX_SLOTS = 4096  # slots a ring may have


def ring_bytes(shape: tuple[int, int, int], slots: int) -> int:
    """The shared memory a ring of `slots` frames of `shape` reserves, in bytes."""
    return _geometry(shape, slots)[2]


def _geometry(shape: tuple[int, int, int], slots: int) -> tuple[int, int, int]:
    """(end of the index, slot stride, total size) in bytes."""
    h, w, c = shape
    index_end = _HEADER + slots * _RECORD
    stride = round_up(h * w * c)
    return index_end, stride, round_up(index_end, _PAGE) + slots * stride


def _check_shape(shape: object, slots: object) -> tuple[tuple[int, int, int], int]:
    ok = (
        isinstance(shape, tuple | list)
        and len(shape) == 3
        and all(isinstance(d, int | np.integer) and 0 < d < 2**16 for d in shape)
    )
    if not ok:
        raise ValueError(f"FrameRing shape must be (height, width, channels) > 0, got {shape!r}")
    if not isinstance(slots, int | np.integer) or not 2 <= slots <= MAX_SLOTS:
        raise ValueError(f"FrameRing slots must be an int in 2..{MAX_SLOTS}, got {slots!r}")
    h, w, c = (int(d) for d in shape)  # type: ignore[union-attr]
    return (h, w, c), int(slots)


class FrameRing:
    """A ring of uint8 frames in shared memory. Single writer, many readers, lock-free.

    Frames are numbered 0, 1, 2, … by the ring; frame i lives in slot i % slots until
    frame i + slots overwrites it. Every slot carries (seq, frame index, capture time):
    seq is odd while the writer fills the slot, so a reader can tell a frame it read
    was overwritten meanwhile and refuse it (None) instead of returning it torn.

    The creator owns the segment (and unlinks it); others attach. All methods of one
    object are for one thread. After close() the object refuses use (ShmError); numpy
    views it handed out earlier stay valid (they keep the mapping alive). A ring attached
    with pixels=False answers `latest()` only.
    """

    def __init__(
        self, name: str, mm: mmap.mmap, shape: tuple[int, int, int], slots: int, pixels: bool
    ) -> None:
        """Private: use FrameRing.create or FrameRing.attach."""
        self.name = name
        self.shape = shape
        self.slots = slots
        self.has_pixels = pixels
        h, w, c = shape
        index_end, stride, _ = _geometry(shape, slots)
        self._mm: mmap.mmap | None = mm
        # np.frombuffer holds a buffer export on the mmap, so mmap.close() cannot unmap
        # while any view derived from it is alive (numpy.ndarray(buffer=...) would not).
        self._base = np.frombuffer(mm, np.uint8)
        self._head = self._base[_OFF_HEAD : _OFF_HEAD + 8].view(np.uint64)
        words = self._base[_HEADER:index_end].view(np.uint64).reshape(slots, _RECORD // 8)
        self._seq = words[:, 0]
        self._index = words[:, 1]
        self._time = words.view(np.int64)[:, 2]
        self._pixels: np.ndarray | None = None
        if pixels:
            self._pixels = as_strided(
                self._base[round_up(index_end, _PAGE) :],
                shape=(slots, h, w, c),
                strides=(stride, w * c, c, 1),
            )
        self._begun: int | None = None

    @classmethod
    def create(cls, name: str, shape: tuple[int, int, int], slots: int) -> FrameRing:
        """Create segment `name` (/dev/shm/<name>); ShmError if it already exists."""
        shape, slots = _check_shape(shape, slots)
        _, _, size = _geometry(shape, slots)
        mm = create_segment(name, size)
        header = np.frombuffer(mm, _RING_HEADER_DTYPE, count=1)
        header["version"] = _RING_VERSION
        header["h"], header["w"], header["c"] = shape
        header["slots"] = slots
        header["head"] = 0
        header["magic"] = _RING_MAGIC  # last: a half-built header never reads as valid
        del header
        ring = cls(name, mm, shape, slots, pixels=True)
        ring._seq[:] = 0
        ring._index[:] = _NO_FRAME
        ring._time[:] = 0
        return ring

    @classmethod
    def attach(cls, name: str, *, pixels: bool = True) -> FrameRing:
        """Attach to an existing ring; ShmError if absent, not a ring, or corrupt.
        pixels=False maps the header and index only (for `latest()`)."""
        mm, size = attach_segment(name, min(_HEADER, _PAGE))
        try:
            shape, slots = cls._read_header(name, mm, size)
        finally:
            release_mmap(mm)
        index_end, _, total = _geometry(shape, slots)
        mm, _ = attach_segment(name, total if pixels else index_end)
        return cls(name, mm, shape, slots, pixels)

    @staticmethod
    def _read_header(name: str, mm: mmap.mmap, size: int) -> tuple[tuple[int, int, int], int]:
        if size < _HEADER or len(mm) < _HEADER:
            raise ShmError(f"shared memory {name!r} is too small ({size} bytes) for a ring")
        header = np.frombuffer(mm, _RING_HEADER_DTYPE, count=1)[0].copy()
        if header["magic"] != _RING_MAGIC:
            raise ShmError(f"shared memory {name!r} is not a frame ring (bad magic)")
        if header["version"] != _RING_VERSION:
            raise ShmError(
                f"frame ring {name!r} has version {header['version']}, expected {_RING_VERSION}"
            )
        try:
            shape, slots = _check_shape(
                (int(header["h"]), int(header["w"]), int(header["c"])), int(header["slots"])
            )
        except ValueError as exc:
            raise ShmError(f"frame ring {name!r} header is corrupt: {exc}") from None
        _, _, total = _geometry(shape, slots)
        if total != size:
            raise ShmError(f"frame ring {name!r} is corrupt: {size} bytes, header implies {total}")
        return shape, slots

    # ---- writer (the FrameSink of drivers.base) ------------------------------------

    def begin(self) -> np.ndarray:
        """Start the next frame: a writable view of its slot.

        The slot is marked busy (seq odd) until commit() or abort(). Calling begin()
        again before either returns the same slot.
        """
        pixels = self._writable()
        if self._begun is not None:
            return pixels[self._begun % self.slots]
        index = self._head.item(0)
        slot = index % self.slots
        seq = self._seq.item(slot)
        # Odd = busy. A writer that died mid-frame left seq odd: step by 2 so that it
        # stays odd but still changes (readers mid-copy must see a change).
        self._seq[slot] = seq + 1 if seq % 2 == 0 else seq + 2
        self._index[slot] = index
        self._begun = index
        return pixels[slot]

    def commit(self, capture_time_ns: int) -> int:
        """Publish the frame begun, stamped with its capture time; return its index."""
        self._check_open()
        if self._begun is None:
            raise ShmError(f"frame ring {self.name!r}: commit() without begin()")
        index = self._begun
        slot = index % self.slots
        self._time[slot] = int(capture_time_ns)
        self._seq[slot] = self._seq.item(slot) + 1
        self._head[0] = index + 1
        self._begun = None
        return index

    def abort(self) -> None:
        """Give up the frame begun (a bad frame): its slot is left holding no frame."""
        self._check_open()
        if self._begun is None:
            return
        slot = self._begun % self.slots
        self._index[slot] = _NO_FRAME
        self._seq[slot] = self._seq.item(slot) + 1
        self._begun = None

    def write(self, frame: np.ndarray, capture_time_ns: int) -> int:
        """Copy `frame` (uint8, exactly `shape`) in as the next frame; return its index."""
        ok = isinstance(frame, np.ndarray) and frame.dtype == np.uint8
        if not ok or frame.shape != self.shape:
            got = (getattr(frame, "shape", None), getattr(frame, "dtype", type(frame).__name__))
            raise ValueError(
                f"frame ring {self.name!r}: frame must be uint8 of shape {self.shape}, got {got}"
            )
        view = self.begin()
        np.copyto(view, frame)
        return self.commit(capture_time_ns)

    # ---- readers ------------------------------------------------------------------

    def latest(self) -> tuple[int, int] | None:
        """(index, capture_time_ns) of the newest committed frame, or None if none yet.

        Copies no pixels; meant for the control lane's every tick.
        """
        if self._mm is None:
            self._check_open()
        for _ in range(_LATEST_TRIES):
            head = self._head.item(0)
            if head == 0:
                return None
            index = head - 1
            slot = index % self.slots
            seq = self._seq.item(slot)
            t = self._time.item(slot)
            if seq % 2 == 0 and self._index.item(slot) == index and self._seq.item(slot) == seq:
                return index, t
            # The writer lapped the whole ring while we looked: look again.
        return None

    def read(self, index: int, out: np.ndarray | None = None) -> tuple[np.ndarray, int] | None:
        """A copy of frame `index` and its capture time, or None if it is not available.

        None when the frame is not written yet, was overwritten (the slot holds another
        frame) or was being overwritten during the copy: never a torn or wrong frame.
        `out` (uint8, `shape`) receives the pixels if given; on None its content is garbage.
        """
        self._check_open()
        if self._pixels is None:
            raise ShmError(f"frame ring {self.name!r} was attached without its pixels")
        if not isinstance(index, int | np.integer) or index < 0:
            raise ValueError(f"frame ring {self.name!r}: index must be an int >= 0, got {index!r}")
        if out is None:
            out = np.empty(self.shape, np.uint8)
        elif out.dtype != np.uint8 or out.shape != self.shape:
            raise ValueError(
                f"frame ring {self.name!r}: out must be uint8 of shape {self.shape}, "
                f"got {out.dtype} {out.shape}"
            )
        index = int(index)
        if index >= self._head.item(0):
            return None
        slot = index % self.slots
        seq = self._seq.item(slot)
        if seq % 2 or self._index.item(slot) != index:
            return None
        t = self._time.item(slot)
        self._copy_slot(slot, out)
        if self._seq.item(slot) != seq:
            return None
        return out, t

    def _copy_slot(self, slot: int, out: np.ndarray) -> None:
        """Copy one slot's pixels (a separate method so tests can interleave a writer)."""
        assert self._pixels is not None
        np.copyto(out, self._pixels[slot])

    # ---- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Detach. Idempotent. A frame begun and not committed is aborted.

        The mapping is released now unless a view handed out by begin() is still
        alive; then it is released when the last such view is collected.
        """
        if self._mm is None:
            return
        if self._begun is not None:
            self.abort()
        mm = self._mm
        self._mm = None
        del self._base, self._head, self._seq, self._index, self._time
        self._pixels = None
        release_mmap(mm)

    def unlink(self) -> None:
        """Remove the /dev/shm file (owner only). Idempotent; attached mappings stay valid."""
        unlink_segment(self.name)

    def _writable(self) -> np.ndarray:
        self._check_open()
        if self._pixels is None:
            raise ShmError(f"frame ring {self.name!r} was attached without its pixels")
        return self._pixels

    def _check_open(self) -> None:
        if self._mm is None:
            raise ShmError(f"frame ring {self.name!r} is closed")

    def __enter__(self) -> FrameRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._mm is None else f"head={self._head.item(0)}"
        return f"FrameRing({self.name!r}, shape={self.shape}, slots={self.slots}, {state})"
