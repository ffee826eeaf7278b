"""robotd's frames on a byte stream (TCP or a Unix stream socket), with no ZeroMQ between.

A message is a list of frames (robotd.framed: a msgpack header, then each large array's
bytes). On the stream each message is a prefix, little-endian: u32 frame count n
(1..framed.MAX_FRAMES) and n u64 frame lengths, then the n frames' bytes back to back.

`FrameWriter` queues messages as views of their frames' memory (nothing is copied into a
body) and writes them with `sendmsg` as far as a non-blocking socket takes them.
`FrameReader` reads a non-blocking socket into one buffer per frame, straight from the
socket for a large frame (no copy through a staging buffer), and hands out each message
once complete. Everything read is hostile: a count out of range, a total over
`max_bytes` or the peer's end is `StreamBroken`, after which the stream is unusable (its
framing can no longer be trusted) and the connection must be closed.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from robotd import framed

COUNT = struct.Struct("<I")
LENGTH = struct.Struct("<Q")
SCRATCH = 64 << 10  # the staging buffer: prefixes and small frames are read through it
PREFIX_READ = 4096  # one read for a prefix (and what follows it, up to this)
DIRECT = 16 << 10  # a frame with this much still to come is read straight into its buffer
READS_PER_TURN = 64  # reads per `receive`: one peer's flood cannot hold a poll loop
LAZY = 64 << 10  # frames this large are allocated uninitialised (`_buffer`)
IOV_MAX = 512  # views per sendmsg (the kernel's limit is 1024)


Frame = bytearray | np.ndarray  # a frame as read: small ones bytearrays, large ones uint8


def _buffer(n: int) -> Frame:
    """Memory for a frame of n bytes. A large one is left uninitialised, so the kernel
    gives it pages only as bytes arrive: a prefix that claims a 1 GiB frame and sends
    nothing costs nothing (a bytearray would be zeroed, every page touched, at once)."""
    return bytearray(n) if n < LAZY else np.empty(n, dtype=np.uint8)


class StreamBroken(Exception):
    """The peer closed the stream or broke its framing (the message says which)."""


def _recv(sock: Any, buf: Any, n: int) -> int | None:
    """Bytes read into buf (0: the peer's end), None when nothing waits; StreamBroken when
    the socket failed."""
    try:
        return sock.recv_into(buf, n)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as err:
        raise StreamBroken(f"the stream failed: {err}") from None


def head(lengths: Sequence[int]) -> bytes:
    """A message's prefix for frames of these lengths."""
    return COUNT.pack(len(lengths)) + struct.pack(f"<{len(lengths)}Q", *lengths)


def views(frames: Sequence[Any]) -> list[memoryview]:
    """The frames as byte views; ValueError for a count out of range."""
    out = [memoryview(f).cast("B") for f in frames]
    if not 1 <= len(out) <= framed.MAX_FRAMES:
        raise ValueError(f"a message of {len(out)} frames (1..{framed.MAX_FRAMES})")
    return out


class FrameWriter:
    """Messages waiting to be written to one socket, oldest first."""

    def __init__(self) -> None:
        self._out: deque[memoryview] = deque()
        self._sizes: deque[int] = deque()  # bytes still to write, message by message
        self.pending_bytes = 0

    @property
    def backlog_bytes(self) -> int:
        """Bytes waiting behind the message being written."""
        return self.pending_bytes - self._sizes[0] if self._sizes else 0

    @property
    def wants_write(self) -> bool:
        """Part of a message waits for the socket to take it."""
        return bool(self._out)

    def queue(self, frames: Sequence[Any]) -> None:
        """Queue one message (ValueError for a frame count out of range)."""
        body = views(frames)
        prefix = memoryview(head([v.nbytes for v in body]))
        self._out.append(prefix)
        self._out.extend(body)
        size = prefix.nbytes + sum(v.nbytes for v in body)
        self._sizes.append(size)
        self.pending_bytes += size

    def write(self, sock: Any, frames: Sequence[Any]) -> None:
        """Queue one message and write what `sock` takes now: `queue` then `flush`, with
        no queue at all when nothing waits and the socket takes the whole message (the
        usual case, and the act's own path)."""
        if self._out:
            self.queue(frames)
            self.flush(sock)
            return
        body = views(frames)
        lengths = [v.nbytes for v in body]
        batch = [memoryview(head(lengths)), *body]
        size = batch[0].nbytes + sum(lengths)
        try:
            sent = sock.sendmsg(batch) if len(batch) <= IOV_MAX else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent == size:
            return
        self._sizes.append(size - sent)
        self.pending_bytes += size - sent
        for v in batch:
            if sent >= v.nbytes:
                sent -= v.nbytes
                continue
            self._out.append(v[sent:] if sent else v)
            sent = 0
        self.flush(sock)

    def flush(self, sock: Any) -> None:
        """Write what waits as far as `sock` (non-blocking) takes it; OSError (other than
        would-block) when the socket failed."""
        out = self._out
        while out:
            batch = [out[i] for i in range(min(len(out), IOV_MAX))]
            try:
                sent = sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return
            self.pending_bytes -= sent
            self._written(sent)
            while sent:
                first = out[0]
                if sent >= first.nbytes:
                    sent -= first.nbytes
                    out.popleft()
                else:
                    out[0] = first[sent:]
                    sent = 0

    def _written(self, sent: int) -> None:
        sizes = self._sizes
        while sent and sizes:
            if sent >= sizes[0]:
                sent -= sizes.popleft()
            else:
                sizes[0] -= sent
                sent = 0

    def clear(self) -> None:
        self._out.clear()
        self._sizes.clear()
        self.pending_bytes = 0


class FrameReader:
    """The messages arriving on one socket, each a list of frames: bytearrays, or 1-D uint8
    arrays for large ones (both buffers)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._scratch = bytearray(SCRATCH)
        self._prefix = bytearray()  # the prefix read so far
        self._need = COUNT.size  # prefix bytes wanted before it can be parsed further
        self._frames: list[Frame] = []  # the message being filled
        self._index = 0  # the frame being filled
        self._got = 0  # bytes of it read
        self.received_bytes = 0

    def receive(self, sock: Any) -> list[list[Frame]]:
        """Read what `sock` (non-blocking) has, bounded per call; the messages completed.
        StreamBroken at the peer's end (after the messages completed before it) or when
        it broke the framing."""
        done: list[list[Frame]] = []
        if not self._frames and not self._prefix and self._whole_small(sock, done):
            return done
        for _ in range(READS_PER_TURN):
            frame = self._frames[self._index] if self._index < len(self._frames) else None
            direct = frame is not None and len(frame) - self._got >= DIRECT
            if direct:
                assert frame is not None
                asked = len(frame) - self._got
                n = _recv(sock, memoryview(frame)[self._got :], 0)
            else:
                # A prefix or a small frame: little at a time, so that a large frame after
                # it is read straight into its own buffer, not through this one.
                asked = self._small_read(frame)
                n = _recv(sock, self._scratch, asked)
            if n is None:
                return done
            if n == 0:
                if done:
                    return done  # the end is seen again on the next read
                raise StreamBroken("the peer closed the stream")
            self.received_bytes += n
            if direct:
                self._got += n
                self._advance(done)
            else:
                self._consume(memoryview(self._scratch)[:n], done)
            if not self._frames and not self._prefix and (n < asked or done):
                # At a message's end, drained or with a message to hand out: stop here
                # rather than pay for a read that would most likely only say "nothing
                # more" (a poll wakes us again if more comes). Within a message keep
                # reading: the rest of it is on its way.
                break
        return done

    def _whole_small(self, sock: Any, done: list[list[Frame]]) -> bool:
        """Between messages: one read, and if it holds exactly one whole message (a reply,
        a ping: the usual case), its frames cut straight out of it (True). Otherwise what
        was read goes the general way, and the caller reads on (False)."""
        n = _recv(sock, self._scratch, PREFIX_READ)
        if n is None:
            return True
        if n == 0:
            raise StreamBroken("the peer closed the stream")
        self.received_bytes += n
        data = memoryview(self._scratch)[:n]
        if n >= COUNT.size:
            (count,) = COUNT.unpack_from(data)
            start = COUNT.size + LENGTH.size * count
            if 1 <= count <= 64 and start <= n:
                lengths = struct.unpack_from(f"<{count}Q", data, COUNT.size)
                if start + sum(lengths) == n:
                    frames: list[Frame] = []
                    for length in lengths:
                        frames.append(bytearray(data[start : start + length]))
                        start += length
                    done.append(frames)
                    return True
        self._consume(data, done)
        return n < PREFIX_READ and not self._frames and not self._prefix

    def _small_read(self, frame: Frame | None) -> int:
        if frame is None:
            return PREFIX_READ
        return min(SCRATCH, len(frame) - self._got + PREFIX_READ)

    def _consume(self, data: memoryview, done: list[list[Frame]]) -> None:
        while data:
            if self._index >= len(self._frames):  # in the prefix
                take = min(len(data), self._need - len(self._prefix))
                self._prefix += data[:take]
                data = data[take:]
                if len(self._prefix) == self._need:
                    self._parse_prefix(done)
                continue
            frame = self._frames[self._index]
            take = min(len(data), len(frame) - self._got)
            memoryview(frame)[self._got : self._got + take] = data[:take]
            self._got += take
            data = data[take:]
            self._advance(done)

    def _parse_prefix(self, done: list[list[Frame]]) -> None:
        (count,) = COUNT.unpack_from(self._prefix)
        if not 1 <= count <= framed.MAX_FRAMES:
            raise StreamBroken(f"the stream broke: a message of {count} frames")
        want = COUNT.size + LENGTH.size * count
        if len(self._prefix) < want:
            self._need = want
            return
        lengths = struct.unpack_from(f"<{count}Q", self._prefix, COUNT.size)
        total = sum(lengths)
        if total > self.max_bytes:
            raise StreamBroken(
                f"the stream broke: a message of {total} bytes, over {self.max_bytes}"
            )
        self._frames = [_buffer(n) for n in lengths]
        self._index = self._got = 0
        self._advance(done)

    def _advance(self, done: list[list[Frame]]) -> None:
        """Step past the frames filled; hand out the message once all are."""
        frames = self._frames
        while self._index < len(frames) and self._got == len(frames[self._index]):
            self._index += 1
            self._got = 0
        if frames and self._index == len(frames):
            done.append(frames)
            self._frames, self._index, self._got = [], 0, 0
            self._prefix = bytearray()
            self._need = COUNT.size
