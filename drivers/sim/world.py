"""The simulated world's state, shared between the sim arm and the sim cameras.

The arm (in the control process) publishes its true joint positions; each sim
camera (a process of its own) takes a consistent snapshot to render. The block
lives in /dev/shm like the frame rings (robotd.shm), guarded by a seqlock: one
writer, any number of readers, no locks. `SimWorld.local` is the same block in
process memory, for the virtual clock and tests.

Layout: magic(8) version(4) n_joints(4) t0_ns(i64) seq(u64) time_ns(i64) pad → 64
bytes, then n_joints float64 positions.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np

from robotd.shm import (
    ShmError,
    attach_segment,
    create_segment,
    release_mmap,
    round_up,
    unlink_segment,
)

_MAGIC = b"RBTDWLD1"
_VERSION = 1
_HEADER = 64
_SNAPSHOT_TRIES = 10_000  # a writer stuck mid-publish (dead) must not hang a reader
_HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "=u4"),
        ("n", "=u4"),
        ("t0", "=i8"),
        ("seq", "=u8"),
        ("time", "=i8"),
    ]
)


WORLD_SUFFIX = "sim-world"


def world_name(shm_prefix: str) -> str:
    """The shared world's segment name in a run's shared-memory namespace."""
    return shm_prefix + WORLD_SUFFIX


def _size(n_joints: int) -> int:
    return _HEADER + round_up(8 * n_joints)


class SimWorld:
    """Joint positions of the simulated robot and the world's time origin.

    `t0_ns` is the world's start on CLOCK_MONOTONIC (shared by all processes of the
    machine) or the virtual clock's origin; sim time is (clock - t0_ns) / 1e9 s.
    One thread writes (publish); any thread or process reads (snapshot).
    """

    def __init__(self, name: str | None, buffer: mmap.mmap | bytearray, n_joints: int) -> None:
        """Private: use SimWorld.create, SimWorld.attach or SimWorld.local."""
        self.name = name
        self.n_joints = n_joints
        self._buffer: mmap.mmap | bytearray | None = buffer
        # np.frombuffer holds a buffer export: the mapping cannot be unmapped under us.
        base = np.frombuffer(buffer, np.uint8)
        self._t0 = int(base[: _HEADER_DTYPE.itemsize].view(_HEADER_DTYPE)["t0"][0])
        self._seq = base[24:32].view(np.uint64)
        self._time = base[32:40].view(np.int64)
        self._q = base[_HEADER : _HEADER + 8 * n_joints].view(np.float64)

    @staticmethod
    def _check(n_joints: object, t0_ns: object) -> None:
        if not isinstance(n_joints, int) or not 1 <= n_joints <= 1024:
            raise ValueError(f"SimWorld n_joints must be an int in 1..1024, got {n_joints!r}")
        if not isinstance(t0_ns, int):
            raise ValueError(f"SimWorld t0_ns must be an int (ns), got {t0_ns!r}")

    @classmethod
    def _init(cls, name: str | None, buffer: mmap.mmap | bytearray, n: int, t0: int) -> SimWorld:
        header = np.frombuffer(buffer, _HEADER_DTYPE, count=1)
        header["version"], header["n"], header["t0"] = _VERSION, n, t0
        header["seq"], header["time"] = 0, t0
        header["magic"] = _MAGIC  # last: a half-built header never reads as valid
        del header
        return cls(name, buffer, n)

    @classmethod
    def create(cls, name: str, n_joints: int, t0_ns: int) -> SimWorld:
        """Create segment `name` in /dev/shm (positions 0 at t0_ns); ShmError if it exists."""
        cls._check(n_joints, t0_ns)
        return cls._init(name, create_segment(name, _size(n_joints)), n_joints, t0_ns)

    @classmethod
    def local(cls, n_joints: int, t0_ns: int) -> SimWorld:
        """The same world in this process's memory (virtual clock, tests)."""
        cls._check(n_joints, t0_ns)
        return cls._init(None, bytearray(_size(n_joints)), n_joints, t0_ns)

    @classmethod
    def attach(cls, name: str) -> SimWorld:
        """Attach to an existing world; ShmError if absent, not a world, or corrupt."""
        mm, _ = attach_segment(name)
        try:
            if len(mm) < _HEADER:
                raise ShmError(f"shared memory {name!r} is too small for a sim world")
            header = np.frombuffer(mm, _HEADER_DTYPE, count=1)[0].copy()
            if header["magic"] != _MAGIC:
                raise ShmError(f"shared memory {name!r} is not a sim world (bad magic)")
            if header["version"] != _VERSION:
                raise ShmError(f"sim world {name!r} has version {header['version']}")
            n = int(header["n"])
            if not 1 <= n <= 1024 or len(mm) != _size(n):
                raise ShmError(f"sim world {name!r} is corrupt ({n} joints, {len(mm)} bytes)")
        except BaseException:
            release_mmap(mm)
            raise
        return cls(name, mm, n)

    @classmethod
    def wait_attach(
        cls,
        name: str,
        sleep_until: Callable[[int], bool],
        clock: Callable[[], int],
        timeout_s: float,
    ) -> SimWorld:
        """Attach once the arm (in the control process) has created the world; ShmError
        after `timeout_s`, or at once if `sleep_until` reports a stop."""
        deadline = clock() + int(timeout_s * 1e9)
        while True:
            try:
                return cls.attach(name)
            except ShmError:
                if clock() >= deadline:
                    raise
            if not sleep_until(min(deadline, clock() + 20_000_000)):
                raise ShmError(f"stopped while waiting for sim world {name!r}")

    @property
    def t0_ns(self) -> int:
        """The world's time origin (ns on the clock its users share)."""
        return self._t0

    def publish(self, q: np.ndarray, time_ns: int) -> None:
        """Publish joint positions `q` (n_joints,) true at `time_ns`."""
        self._check_open()
        if np.shape(q) != (self.n_joints,):
            raise ValueError(
                f"SimWorld.publish: q must have shape ({self.n_joints},), got {np.shape(q)}"
            )
        seq = self._seq.item(0)
        self._seq[0] = seq + 1 if seq % 2 == 0 else seq + 2  # odd: busy
        self._q[:] = q
        self._time[0] = int(time_ns)
        self._seq[0] = self._seq.item(0) + 1

    def snapshot(self) -> tuple[np.ndarray, int]:
        """A consistent copy of (positions, their time_ns); ShmError if the writer is stuck."""
        self._check_open()
        for _ in range(_SNAPSHOT_TRIES):
            seq = self._seq.item(0)
            if seq % 2:
                continue
            q = self._q.copy()
            t = self._time.item(0)
            if self._seq.item(0) == seq:
                return q, t
        raise ShmError(f"sim world {self.name!r}: writer stuck mid-publish (seq {seq})")

    def close(self) -> None:
        """Detach; idempotent. Arrays returned by snapshot() are copies and stay valid."""
        if self._buffer is None:
            return
        buffer = self._buffer
        self._buffer = None
        del self._seq, self._time, self._q
        if isinstance(buffer, mmap.mmap):
            release_mmap(buffer)

    def unlink(self) -> None:
        """Remove the /dev/shm file (owner only); idempotent; no-op for a local world."""
        if self.name is not None:
            unlink_segment(self.name)

    def _check_open(self) -> None:
        if self._buffer is None:
            raise ShmError(f"sim world {self.name!r} is closed")

    def __enter__(self) -> SimWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
