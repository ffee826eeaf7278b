"""FrameRing: round trips, overwrite and torn-read detection, attach errors, clean-up."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from robotd.shm import SHM_DIR, FrameRing, ShmError, ring_slots, unlink_prefix

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (6, 8, 3)


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"robotd-test-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    yield p
    unlink_prefix(p)


def frame_for(index: int, shape: tuple[int, int, int] = SHAPE) -> np.ndarray:
    return np.full(shape, index % 251, np.uint8)


def test_write_read_round_trip_and_latest(prefix: str) -> None:
    ring = FrameRing.create(prefix + "cam", SHAPE, 4)
    assert ring.latest() is None
    assert ring.read(0) is None  # not written yet
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, SHAPE, dtype=np.uint8) for _ in range(3)]
    for i, frame in enumerate(frames):
        assert ring.write(frame, 1000 + i) == i
        assert ring.latest() == (i, 1000 + i)
    for i, frame in enumerate(frames):
        got = ring.read(i)
        assert got is not None
        assert np.array_equal(got[0], frame) and got[1] == 1000 + i
    out = np.zeros(SHAPE, np.uint8)
    got = ring.read(2, out)
    assert got is not None and got[0] is out and np.array_equal(out, frames[2])
    ring.close()
    ring.unlink()


def test_reader_in_another_attachment_sees_frames(prefix: str) -> None:
    writer = FrameRing.create(prefix + "cam", SHAPE, 3)
    reader = FrameRing.attach(prefix + "cam")
    assert (reader.shape, reader.slots) == (SHAPE, 3)
    view = writer.begin()
    view[:] = 7
    assert reader.latest() is None  # begun, not committed
    assert reader.read(0) is None
    assert writer.commit(55) == 0
    assert reader.latest() == (0, 55)
    got = reader.read(0)
    assert got is not None and np.all(got[0] == 7)
    reader.close()
    writer.close()


def test_overwritten_frame_is_refused(prefix: str) -> None:
    ring = FrameRing.create(prefix + "cam", SHAPE, 4)
    for i in range(ring.slots + 1):
        ring.write(frame_for(i), i)
    assert ring.read(0) is None  # slot 0 now holds frame 4
    got = ring.read(1)
    assert got is not None and np.all(got[0] == 1)
    assert ring.read(ring.slots + 1) is None  # the future
    ring.close()


class _HookedRing(FrameRing):
    """A reader whose copy is interrupted half-way by a writer (a deterministic torn read)."""

    writer: FrameRing

    def _copy_slot(self, slot: int, out: np.ndarray) -> None:
        half = out.shape[0] // 2
        np.copyto(out[:half], self._pixels[slot][:half])
        for _ in range(self.slots):  # lap the ring: this slot gets the newest frame
            head = self.writer.latest()
            nxt = 0 if head is None else head[0] + 1
            self.writer.write(frame_for(nxt), nxt)
        np.copyto(out[half:], self._pixels[slot][half:])


def test_torn_read_is_detected(prefix: str) -> None:
    writer = FrameRing.create(prefix + "cam", SHAPE, 3)
    writer.write(frame_for(0), 0)
    reader = _HookedRing.attach(prefix + "cam")
    reader.writer = writer
    out = np.zeros(SHAPE, np.uint8)
    assert reader.read(0, out) is None
    # The copy really was torn: without the seq check it would have been returned.
    assert out[0, 0, 0] == 0 and out[-1, 0, 0] == 3
    reader.close()
    writer.close()


_WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from robotd.shm import FrameRing
    ring = FrameRing.attach(sys.argv[1])
    end = time.monotonic() + float(sys.argv[2])
    i = 0
    while time.monotonic() < end:
        view = ring.begin()
        view[:] = i % 251
        ring.commit(i * 10)
        i += 1
    ring.close()
    """
)


def test_reader_never_gets_a_torn_frame_from_a_writer_process(prefix: str) -> None:
    shape = (240, 320, 3)
    ring = FrameRing.create(prefix + "cam", shape, 2)  # 2 slots: the writer laps constantly
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, ring.name, "0.4"], env=env)
    try:
        deadline = time.monotonic() + 15
        while ring.latest() is None:
            assert proc.poll() is None and time.monotonic() < deadline, "writer never wrote"
            time.sleep(0.001)
        ok = refused = 0
        out = np.empty(shape, np.uint8)
        while proc.poll() is None:
            latest = ring.latest()
            assert latest is not None and latest[1] == latest[0] * 10
            for index in (latest[0] - 1, latest[0]):
                got = ring.read(max(index, 0), out)
                if got is None:
                    refused += 1
                    continue
                ok += 1
                assert got[1] == max(index, 0) * 10, "wrong frame"
                assert np.all(out == max(index, 0) % 251), f"torn frame {index}"
        assert proc.wait(timeout=10) == 0
        assert ok > 0
    finally:
        proc.kill()
        proc.wait()
        ring.close()


def test_abort_and_a_writer_that_died_mid_frame(prefix: str) -> None:
    ring = FrameRing.create(prefix + "cam", SHAPE, 2)
    ring.write(frame_for(0), 0)
    ring.write(frame_for(1), 1)
    view = ring.begin()  # frame 2 goes into frame 0's slot
    view[:] = 99
    ring.abort()
    assert ring.latest() == (1, 1)
    assert ring.read(0) is None  # its pixels were damaged by the aborted frame
    # A writer dies mid-frame (seq left odd); a new writer attaches and carries on.
    ring.begin()
    second = FrameRing.attach(ring.name)
    assert second.write(frame_for(2), 2) == 2
    got = ring.read(2)
    assert got is not None and np.all(got[0] == 2)
    second.close()


def test_write_checks_frames(prefix: str) -> None:
    ring = FrameRing.create(prefix + "cam", SHAPE, 2)
    with pytest.raises(ValueError, match=r"uint8 of shape \(6, 8, 3\)"):
        ring.write(np.zeros((6, 8), np.uint8), 0)
    with pytest.raises(ValueError, match="uint8"):
        ring.write(np.zeros(SHAPE, np.float32), 0)
    with pytest.raises(ValueError, match="out must be"):
        ring.read(0, np.zeros((1, 1, 3), np.uint8))
    with pytest.raises(ValueError, match="index"):
        ring.read(-1)
    with pytest.raises(ShmError, match="without begin"):
        ring.commit(0)
    with pytest.raises(ValueError, match="slots"):
        FrameRing.create(prefix + "x", SHAPE, 1)
    with pytest.raises(ValueError, match="shape"):
        FrameRing.create(prefix + "x", (6, 8), 4)  # type: ignore[arg-type]


def test_close_keeps_outstanding_views_valid(prefix: str) -> None:
    ring = FrameRing.create(prefix + "cam", SHAPE, 2)
    view = ring.begin()
    ring.close()
    view[:] = 5  # must not crash: the mapping lives as long as the view
    assert int(view.sum()) == 5 * view.size
    ring.close()  # idempotent
    with pytest.raises(ShmError, match="closed"):
        ring.latest()
    with pytest.raises(ShmError, match="closed"):
        ring.begin()
    ring.unlink()
    ring.unlink()  # idempotent
    assert not (SHM_DIR / ring.name).exists()


def test_create_and_attach_errors(prefix: str) -> None:
    with pytest.raises(ShmError, match="does not exist"):
        FrameRing.attach(prefix + "absent")
    FrameRing.create(prefix + "cam", SHAPE, 2).close()
    with pytest.raises(ShmError, match="already exists"):
        FrameRing.create(prefix + "cam", SHAPE, 2)
    (SHM_DIR / (prefix + "junk")).write_bytes(b"x" * 200)
    with pytest.raises(ShmError, match="not a frame ring"):
        FrameRing.attach(prefix + "junk")
    (SHM_DIR / (prefix + "empty")).write_bytes(b"")
    with pytest.raises(ShmError, match="empty"):
        FrameRing.attach(prefix + "empty")
    data = (SHM_DIR / (prefix + "cam")).read_bytes()
    (SHM_DIR / (prefix + "short")).write_bytes(data[:-64])
    with pytest.raises(ShmError, match="corrupt"):
        FrameRing.attach(prefix + "short")
    bad_version = bytearray(data)
    bad_version[8] = 99
    (SHM_DIR / (prefix + "version")).write_bytes(bytes(bad_version))
    with pytest.raises(ShmError, match="version 99"):
        FrameRing.attach(prefix + "version")
    for bad in ("", "a/b", "../x", ".hidden"):
        with pytest.raises(ValueError, match="invalid"):
            FrameRing.attach(bad)


def test_unlink_prefix_removes_only_matching(prefix: str) -> None:
    other = f"robotd-other-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    FrameRing.create(prefix + "top", SHAPE, 2).close()
    FrameRing.create(prefix + "wrist", SHAPE, 2).close()
    FrameRing.create(other, SHAPE, 2).close()
    try:
        assert unlink_prefix(prefix) == [prefix + "top", prefix + "wrist"]
        assert unlink_prefix(prefix) == []
        assert (SHM_DIR / other).exists()
        with pytest.raises(ValueError):
            unlink_prefix("")
    finally:
        unlink_prefix(other)


def test_ring_slots() -> None:
    assert ring_slots(30, 1.0) == 31
    assert ring_slots(30, 0.01) == 4
    with pytest.raises(ValueError):
        ring_slots(0, 1.0)
