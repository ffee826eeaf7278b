"""Shared memory between robotd's processes: plain /dev/shm files mapped with mmap.

Why not multiprocessing.shared_memory: on Python 3.11 its resource_tracker
unlinks a segment when a child that merely attached to it exits. Here the
process that creates a segment owns it and is the only one that unlinks it.

FrameRing is the camera → control-lane path: one writer (the camera process),
any number of readers, no locks. Each slot carries a sequence counter
(seqlock): odd while the writer fills it, even once published. A reader reads
the counter, the slot, then the counter again; any change means the slot was
being overwritten and the read is refused rather than returned torn.

Memory ordering: the counters are aligned 8-byte stores and loads. x86-64 keeps
stores (and loads) in program order, which is all a seqlock needs; on weakly
ordered CPUs (ARM) the interpreter's own atomic operations between statements
act as barriers in practice, but no explicit fence is issued.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import tempfile
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import as_strided

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
_ALIGN = 64

# Ring header: magic(8) version(4) h(4) w(4) c(4) slots(4) pad(4) head(8) → padded to 64.
_RING_MAGIC = b"RBTDRNG1"
_RING_VERSION = 1
_HEADER = 64
_OFF_HEAD = 32
_SLOT_HEADER = 64  # seq u64, frame index u64, capture time i64, padding
_NO_FRAME = np.iinfo(np.uint64).max  # frame index of a slot that holds no valid frame
_LATEST_TRIES = 4


class ShmError(Exception):
    """A shared-memory segment is missing, already exists, is corrupt, or was closed."""


def round_up(n: int, align: int = _ALIGN) -> int:
    """n rounded up to a multiple of align."""
    return (n + align - 1) // align * align


def shm_path(name: str) -> Path:
    """The file backing segment `name`; ValueError for a name that is not a plain file name."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"shared memory name {name!r} is invalid: use 1-200 characters of "
            "letters, digits, '.', '_', '-' (no '/'), not starting with '.' or '-'"
        )
    return SHM_DIR / name


def create_segment(name: str, size: int) -> mmap.mmap:
    """Create the file for segment `name` (exclusive) with `size` bytes reserved and map it.

    The pages are reserved up front (posix_fallocate) so that a full /dev/shm is a
    clear ShmError now rather than a SIGBUS on first write.
    """
    path = shm_path(name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ShmError(
            f"shared memory {name!r} already exists ({path}); a previous run may have "
            "crashed: remove it (robotd.shm.unlink_prefix) and retry"
        ) from None
    except OSError as exc:
        raise ShmError(f"cannot create shared memory {name!r} ({path}): {exc}") from exc
    try:
        _reserve(fd, size, name)
        return mmap.mmap(fd, size)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)


def _reserve(fd: int, size: int, name: str) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except AttributeError:  # not on this platform
        os.ftruncate(fd, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            os.ftruncate(fd, size)
        else:
            raise ShmError(f"cannot reserve {size} bytes of shared memory {name!r}: {exc}") from exc


def attach_segment(name: str) -> mmap.mmap:
    """Map the existing segment `name` read-write; ShmError if it is absent or empty."""
    path = shm_path(name)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise ShmError(f"shared memory {name!r} does not exist ({path})") from None
    except OSError as exc:
        raise ShmError(f"cannot open shared memory {name!r} ({path}): {exc}") from exc
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise ShmError(f"shared memory {name!r} is empty ({path}): not a robotd segment")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def release_mmap(mm: mmap.mmap) -> bool:
    """Unmap now if nothing still views the mapping; else leave it to the last view's collection.

    Returns True if unmapped now. Never unmaps under a live numpy view (which would
    make touching that view crash the process).
    """
    try:
        mm.close()
    except BufferError:
        return False
    return True


def unlink_segment(name: str) -> bool:
    """Remove segment `name`'s file; True if it existed. Mappings stay valid until unmapped."""
    try:
        os.unlink(shm_path(name))
    except FileNotFoundError:
        return False
    return True


def unlink_prefix(prefix: str) -> list[str]:
    """Remove every leftover segment whose name starts with `prefix`; return their names.

    Used at start-up to clean up after a crashed run. The prefix must be a valid,
    non-empty name so that a mistake cannot empty /dev/shm.
    """
    shm_path(prefix)  # validates
    removed = []
    for entry in sorted(SHM_DIR.iterdir()):
        if entry.name.startswith(prefix) and unlink_segment(entry.name):
            removed.append(entry.name)
    return removed


def ring_slots(fps: float, budget_s: float, minimum: int = 4) -> int:
    """Slots a ring needs to keep `budget_s` seconds of frames at `fps` (at least `minimum`)."""
    if not (fps > 0 and budget_s >= 0):
        raise ValueError(f"ring_slots: fps must be > 0 and budget_s >= 0, got {fps}, {budget_s}")
    return max(minimum, int(np.ceil(fps * budget_s)) + 1)


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


def _ring_geometry(shape: tuple[int, int, int], slots: int) -> tuple[int, int]:
    """(slot stride, total size) in bytes."""
    h, w, c = shape
    stride = _SLOT_HEADER + round_up(h * w * c)
    return stride, _HEADER + slots * stride


def _check_shape(shape: object, slots: object) -> tuple[tuple[int, int, int], int]:
    ok = (
        isinstance(shape, tuple | list)
        and len(shape) == 3
        and all(isinstance(d, int | np.integer) and 0 < d < 2**16 for d in shape)
    )
    if not ok:
        raise ValueError(f"FrameRing shape must be (height, width, channels) > 0, got {shape!r}")
    if not isinstance(slots, int | np.integer) or not 2 <= slots <= 4096:
        raise ValueError(f"FrameRing slots must be an int in 2..4096, got {slots!r}")
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
    views it handed out earlier stay valid (they keep the mapping alive).
    """

    def __init__(self, name: str, mm: mmap.mmap, shape: tuple[int, int, int], slots: int) -> None:
        """Private: use FrameRing.create or FrameRing.attach."""
        self.name = name
        self.shape = shape
        self.slots = slots
        h, w, c = shape
        stride, _ = _ring_geometry(shape, slots)
        self._mm: mmap.mmap | None = mm
        # np.frombuffer holds a buffer export on the mmap, so mmap.close() cannot unmap
        # while any view derived from it is alive (numpy.ndarray(buffer=...) would not).
        self._base = np.frombuffer(mm, np.uint8)
        self._head = self._base[_OFF_HEAD : _OFF_HEAD + 8].view(np.uint64)
        words = self._base[_HEADER : _HEADER + slots * stride].view(np.uint64)
        words = words.reshape(slots, stride // 8)
        self._seq = words[:, 0]
        self._index = words[:, 1]
        self._time = words.view(np.int64)[:, 2]
        self._pixels = as_strided(
            self._base[_HEADER + _SLOT_HEADER :],
            shape=(slots, h, w, c),
            strides=(stride, w * c, c, 1),
        )
        self._begun: int | None = None

    @classmethod
    def create(cls, name: str, shape: tuple[int, int, int], slots: int) -> FrameRing:
        """Create segment `name` (/dev/shm/<name>); ShmError if it already exists."""
        shape, slots = _check_shape(shape, slots)
        _, size = _ring_geometry(shape, slots)
        mm = create_segment(name, size)
        header = np.frombuffer(mm, _RING_HEADER_DTYPE, count=1)
        header["version"] = _RING_VERSION
        header["h"], header["w"], header["c"] = shape
        header["slots"] = slots
        header["head"] = 0
        header["magic"] = _RING_MAGIC  # last: a half-built header never reads as valid
        del header
        ring = cls(name, mm, shape, slots)
        ring._seq[:] = 0
        ring._index[:] = _NO_FRAME
        ring._time[:] = 0
        return ring

    @classmethod
    def attach(cls, name: str) -> FrameRing:
        """Attach to an existing ring; ShmError if absent, not a ring, or corrupt."""
        mm = attach_segment(name)
        try:
            shape, slots = cls._read_header(name, mm)
        except BaseException:
            release_mmap(mm)
            raise
        return cls(name, mm, shape, slots)

    @staticmethod
    def _read_header(name: str, mm: mmap.mmap) -> tuple[tuple[int, int, int], int]:
        if len(mm) < _HEADER:
            raise ShmError(f"shared memory {name!r} is too small ({len(mm)} bytes) for a ring")
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
        _, size = _ring_geometry(shape, slots)
        if size != len(mm):
            raise ShmError(
                f"frame ring {name!r} is corrupt: {len(mm)} bytes, header implies {size}"
            )
        return shape, slots

    # ---- writer -------------------------------------------------------------------

    def begin(self) -> tuple[int, np.ndarray]:
        """Start the next frame: (its index, a writable view of its slot).

        The slot is marked busy (seq odd) until commit() or abort(). Calling begin()
        again before either returns the same frame.
        """
        self._check_open()
        if self._begun is not None:
            return self._begun, self._pixels[self._begun % self.slots]
        index = self._head.item(0)
        slot = index % self.slots
        seq = self._seq.item(slot)
        # Odd = busy. A writer that died mid-frame left seq odd: step by 2 so that it
        # stays odd but still changes (readers mid-copy must see a change).
        self._seq[slot] = seq + 1 if seq % 2 == 0 else seq + 2
        self._index[slot] = index
        self._begun = index
        return index, self._pixels[slot]

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
        _, view = self.begin()
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
        del self._base, self._head, self._seq, self._index, self._time, self._pixels
        release_mmap(mm)

    def unlink(self) -> None:
        """Remove the /dev/shm file (owner only). Idempotent; attached mappings stay valid."""
        unlink_segment(self.name)

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
