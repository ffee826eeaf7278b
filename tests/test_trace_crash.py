"""A real writer process killed with SIGKILL at random points while it writes: every file
reads back to (at least) its last flushed record, each record exactly as written."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import select
import signal
import time

from trace_util import CONFIG, only_run, tick

from robotd.trace import codec
from robotd.trace.reader import TraceReader
from robotd.trace.store import TraceStore

KILLS = 20
SYNC_EVERY = 40


def _jpeg(i: int) -> bytes:
    """Deterministic frame bytes of 64–320 KB for record i (not a real JPEG: the store does
    not look inside)."""
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * 10_000)[: 64_000 + seed[1] * 1000]


def _expected(i: int) -> tuple[str, object]:
    return ("/camera/top", _jpeg(i)) if i % 3 == 2 else ("/robot/tick", tick(i))


def _writer(root: str, fd: int) -> None:
    """The child: write forever (a bounded forever), reporting after each flush how many
    records were queued before it."""
    # big uncompressed chunks: much of the child's time goes into writing them, so many
    # kills land inside a write and leave a torn chunk behind
    store = TraceStore(root, 1 << 30, CONFIG, flush_bytes=2 << 20, flush_s=0.05, fsync=False,
                       compression="none")
    ep = store.begin_episode(1, "w1", "crash test")
    for i in range(200_000):
        topic, value = _expected(i)
        if topic == "/robot/tick":
            ok = ep.write(topic, 1_000 + i, value)
        else:
            ok = ep.frame("top", 1_000 + i, value, i)
        if not ok:  # the queue is full: wait for the writer rather than lose records
            store.flush()
            ok = ep.write(topic, 1_000 + i, value) if topic == "/robot/tick" else ep.frame(
                "top", 1_000 + i, value, i)
            assert ok
        if (i + 1) % SYNC_EVERY == 0:
            store.flush()
            os.write(fd, b"%d\n" % (i + 1))
    os._exit(0)


class _Lines:
    """Lines from the child's pipe (plain text, no pickle), read with a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.eof = fd, b"", False

    def next(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if self.eof or left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 4096)
            self.eof = not chunk
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return int(line)


def _check(path, synced: int) -> tuple[int, bool]:
    reader = TraceReader(path)
    n = 0
    for msg in reader.messages(["/robot/tick", "/camera/top"]):
        topic, value = _expected(n)
        assert msg.topic == topic, (path, n)
        if topic == "/robot/tick":
            assert msg.record == value, (path, n)
        else:
            assert codec.frame_bytes(msg.record) == value and msg.record["frame_index"] == n
        n += 1
    st = reader.status
    assert not st.complete and st.bad_messages == 0, st.message
    assert n >= synced, (path, n, synced, st.message)
    return n, st.torn


def test_sigkill_mid_write_loses_nothing_flushed(tmp_path):
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(12)
    outcomes = []
    for k in range(KILLS):
        root = tmp_path / f"k{k}"
        rfd, wfd = os.pipe()
        proc = ctx.Process(target=_writer, args=(str(root), wfd), daemon=True)
        proc.start()
        os.close(wfd)
        lines = _Lines(rfd)
        synced = 0
        for _ in range(rng.randint(1, 4)):
            got = lines.next(60)
            assert got is not None, "the writer process reported no flush"
            synced = got
        # a random kill point: somewhere in the next flush interval or two (not a wait
        # for anything; what is on disk at the kill is what the check reads)
        time.sleep(rng.uniform(0, 0.03))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL
        while (got := lines.next(0)) is not None:  # flushes reported before the kill landed
            synced = got
        os.close(rfd)
        outcomes.append((synced, *_check(only_run(root) / "episode-000001.mcap", synced)))
    assert len(outcomes) == KILLS
    print("synced, recovered, torn:", outcomes)
