"""robotd.worker.channel: a copy's Unix socket pair, both ends, over real sockets: messages
whole whatever the socket takes at once, hostile prefixes refused, the end seen, and the
copy's receive buffers reused only once nothing holds them."""

from __future__ import annotations

import mmap
import struct
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from robotd import framed
from robotd.worker import channel, pipe
from robotd.worker.channel import Channel, ChannelClosed, CopyEnd


@pytest.fixture
def ends() -> Iterator[tuple[Channel, CopyEnd]]:
    ours, theirs = channel.pair()
    worker, copy = Channel(ours), CopyEnd(theirs)
    yield worker, copy
    worker.close()
    copy.close()


def _drain(worker: Channel, want: int = 1) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    while len(got) < want:
        got += worker.receive()
    return got


def test_messages_go_both_ways_whole(ends) -> None:
    worker, copy = ends
    image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    worker.send(pipe.pack({"k": "act", "top": image, "n": 3}))
    job = pipe.unpack(copy.recv())
    np.testing.assert_array_equal(job["top"], image)
    assert job["n"] == 3 and not job["top"].flags.writeable
    copy.send(pipe.pack({"k": "done", "rows": np.ones((2, 3), np.float32)}))
    copy.send(pipe.pack({"k": "done", "rows": np.zeros((1, 1))}))
    first, second = (pipe.unpack(m) for m in _drain(worker, 2))
    assert first["rows"].dtype == np.float32 and second["rows"].shape == (1, 1)


def test_large_frames_go_through_the_arena_and_then_the_socket(ends) -> None:
    worker, copy = ends
    first = np.arange(3 << 20, dtype=np.uint8)
    worker.send(pipe.pack({"a": first}))  # the arena (grown to fit: its descriptor sent)
    assert not worker.wants_write
    big = np.arange(24 << 20, dtype=np.uint16)  # the arena is busy: through the socket,
    worker.send(pipe.pack({"b": big}))  # far over what it takes at once
    assert worker.wants_write  # the rest waits for the poll loop's POLLOUT
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(pipe.unpack(copy.recv()) for _ in "ab"))
    reader.start()
    while worker.wants_write:
        worker.flush()
    reader.join(30)
    assert not reader.is_alive()
    np.testing.assert_array_equal(got[0]["a"], first)
    np.testing.assert_array_equal(got[1]["b"], big)


def test_the_arena_is_reused_once_answered_and_grows(ends) -> None:
    worker, copy = ends
    for size, value in ((1 << 20, 1), (1 << 20, 2), (5 << 20, 3), (100 << 10, 4)):
        frame = np.full(size, value, np.uint8)
        worker.send(pipe.pack({"x": frame, "small": np.arange(4)}))
        got = pipe.unpack(copy.recv())
        assert got["x"].shape == (size,) and (got["x"] == value).all()
        assert got["small"].tolist() == [0, 1, 2, 3]
        copy.send(pipe.pack({"k": "done"}))  # answered: the arena is free again
        assert worker.receive()
        assert not worker.wants_write  # each went through the arena, none through the socket
    view = copy._arena.view
    assert view is not None and view.readonly and len(view) >= 5 << 20
    with pytest.raises(PermissionError):  # sealed: no one maps it writable any more
        mmap.mmap(worker._arena.fd, 4096)  # type: ignore[arg-type]


def _prefix(count: int, *lengths: int) -> bytes:
    return struct.pack("<I", count) + b"".join(struct.pack("<Q", n) for n in lengths)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (_prefix(0), "a message of 0 frames"),
        (_prefix(framed.MAX_FRAMES + 1), f"a message of {framed.MAX_FRAMES + 1} frames"),
        (_prefix(2, 1 << 40, 1), "over"),
    ],
)
def test_a_broken_stream_from_a_copy_closes_its_channel(ends, raw: bytes, needle: str) -> None:
    worker, copy = ends
    copy.sock.sendall(raw)
    with pytest.raises(ChannelClosed, match=needle):
        _drain(worker)
    assert worker.closed


def test_the_copy_sees_a_broken_stream_and_the_end(ends) -> None:
    worker, copy = ends
    worker.sock.sendall(_prefix(0))
    with pytest.raises(ChannelClosed, match="0 frames"):
        copy.recv()
    worker.close()
    with pytest.raises(ChannelClosed, match="closed"):
        copy.recv()


def test_the_worker_sees_the_copy_end_after_its_last_words(ends) -> None:
    worker, copy = ends
    copy.send(pipe.pack({"k": "lost", "message": "out of memory"}))
    copy.close()
    assert pipe.unpack(_drain(worker)[0])["k"] == "lost"  # read before the end
    with pytest.raises(ChannelClosed, match="closed its channel"):
        worker.receive()


def test_receive_buffers_are_reused_only_when_nothing_holds_them(ends) -> None:
    worker, copy = ends
    size = 64 << 10

    def job(value: int) -> np.ndarray:
        worker.send(pipe.pack({"a": np.full(size, value, np.uint8)}))
        return pipe.unpack(copy.recv())["a"]

    job(0)
    job(1)
    settled = copy.fresh_bytes
    for value in (2, 3, 4):
        assert job(value)[0] == value
    assert copy.fresh_bytes == settled  # each job read into the last one's buffers
    kept = job(5)  # the policy keeps this one
    for value in (6, 7):
        job(value)
    assert (kept == 5).all()  # what is held is never read into
    assert copy.fresh_bytes >= settled + size  # a fresh buffer took its place
