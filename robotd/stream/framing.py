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
framing can no longer be trusted) and the connection must be closed. A stream that opens
with a ZeroMQ greeting (robotd.stream.zmtp: exact, at most its 10 bytes held to tell) is
`SpeaksZeroMQ`: an endpoint of the other kind, named so.
"""

from __future__ import annotations

import errno
import struct
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from robotd import framed
from robotd.stream import zmtp

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


class StreamEnded(StreamBroken):
    """The peer closed the stream, between messages or in one (no framing was broken)."""


class SpeaksZeroMQ(StreamBroken):
    """The peer opened the stream with a ZeroMQ (ZMTP) greeting: it is a ZeroMQ socket, not
    robotd's stream framing (robotd.stream.zmtp)."""


def _read(sock: Any, views: list[memoryview]) -> int | None:
    """Bytes read into `views`, in order, in one system call (0: the peer's end), None
    when nothing waits; StreamBroken when the socket failed."""
    try:
        return sock.recvmsg_into(views)[0]
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as err:
        if err.errno in (errno.ECONNRESET, errno.EPIPE):  # it closed with our bytes unread
            raise StreamEnded(f"the peer closed the stream: {err}") from None
        raise StreamBroken(f"the stream failed: {err}") from None


_HEADS = [struct.Struct(f"<I{n}Q") for n in range(17)]  # the prefix of n frames, n <= 16
_LENGTHS = [struct.Struct(f"<{n}Q") for n in range(17)]  # the lengths in it


def head(lengths: Sequence[int]) -> bytes:
    """A message's prefix for frames of these lengths."""
    n = len(lengths)
    if n < len(_HEADS):
        return _HEADS[n].pack(n, *lengths)
    return COUNT.pack(n) + struct.pack(f"<{n}Q", *lengths)


def _message(frames: Sequence[Any]) -> tuple[list[memoryview], int]:
    """A message as it goes on the stream: its prefix, then its frames as byte views, and
    its size in bytes (ValueError for a frame count out of range)."""
    body = [memoryview(f).cast("B") for f in frames]
    if not 1 <= len(body) <= framed.MAX_FRAMES:
        raise ValueError(f"a message of {len(body)} frames (1..{framed.MAX_FRAMES})")
    lengths = [v.nbytes for v in body]
    prefix = memoryview(head(lengths))
    return [prefix, *body], prefix.nbytes + sum(lengths)


def _send(sock: Any, batch: list[memoryview]) -> int:
    """Bytes of `batch` the non-blocking `sock` took (0: none now; OSError: it failed)."""
    if len(batch) > IOV_MAX:
        batch = batch[:IOV_MAX]
    try:
        return sock.sendmsg(batch)
    except (BlockingIOError, InterruptedError):
        return 0


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
        self._queue(*_message(frames), 0)

    def write(self, sock: Any, frames: Sequence[Any]) -> int:
        """Queue one message and write what `sock` takes now, as `queue` then `flush` do;
        with nothing waiting, the message goes straight from its frames, unqueued when the
        socket takes it whole (the usual case, and the act's own path). Returns the
        message's size on the stream."""
        batch, size = _message(frames)
        sent = 0 if self._out else _send(sock, batch)
        if sent < size:
            self._queue(batch, size, sent)
            self.flush(sock)
        return size

    def flush(self, sock: Any) -> None:
        """Write what waits as far as `sock` (non-blocking) takes it; OSError (other than
        would-block) when the socket failed."""
        out = self._out
        while out:
            sent = _send(sock, [out[i] for i in range(min(len(out), IOV_MAX))])
            if not sent:
                return
            self._sent(sent)

    def _queue(self, batch: list[memoryview], size: int, sent: int) -> None:
        """`batch` (a prefix and its frames, `size` bytes) waits, but for the `sent` bytes
        of it written."""
        self._out.extend(batch)
        self._sizes.append(size)
        self.pending_bytes += size
        self._sent(sent)

    def _sent(self, sent: int) -> None:
        """`sent` bytes of the oldest waiting ones were written: drop them."""
        self.pending_bytes -= sent
        self._written(sent)
        out = self._out
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
        self._scratch = memoryview(bytearray(SCRATCH))
        self._prefix = bytearray()  # the prefix read so far
        self._need = COUNT.size  # prefix bytes wanted before it can be parsed further
        self._frames: list[Frame] = []  # the message being filled
        self._index = 0  # the frame being filled
        self._got = 0  # bytes of it read
        self._opening: bytearray | None = bytearray()  # the stream's first bytes, until told
        self.received_bytes = 0

    def receive(self, sock: Any) -> list[list[Frame]]:
        """Read what `sock` (non-blocking) has, bounded per call; the messages completed.
        StreamBroken at the peer's end (after the messages completed before it) or when
        it broke the framing."""
        done: list[list[Frame]] = []
        for _ in range(READS_PER_TURN):
            frame = self._frames[self._index] if self._index < len(self._frames) else None
            direct = frame is not None and len(frame) - self._got >= DIRECT
            if direct:
                # The rest of this frame and the frames after it, in one read: a scatter
                # read costs one system call where a read per frame costs one each.
                views = self._rest()
            else:
                # A prefix or a small frame: little at a time, so that a large frame after
                # it is read straight into its own buffer, not through this one.
                views = [self._scratch[: self._small_read(frame)]]
            asked = sum(len(v) for v in views)
            n = _read(sock, views)
            if n is None:
                return done
            if n == 0:
                if done:
                    return done  # the end is seen again on the next read
                raise StreamEnded("the peer closed the stream")
            self.received_bytes += n
            if direct:
                self._filled(n, done)
            else:
                self._consume(self._scratch[:n], done)
            if not self._frames and not self._prefix and (n < asked or done):
                # At a message's end, drained or with a message to hand out: stop here
                # rather than pay for a read that would most likely only say "nothing
                # more" (a poll wakes us again if more comes). Within a message keep
                # reading: the rest of it is on its way.
                break
        return done

    def _rest(self) -> list[memoryview]:
        """Byte views of what the message still needs: the rest of the frame being
        filled, then the frames after it (at most IOV_MAX views)."""
        frames, index = self._frames, self._index
        views = [memoryview(frames[index]).cast("B")[self._got :]]
        views += [memoryview(f).cast("B") for f in frames[index + 1 : index + IOV_MAX]]
        return views

    def _filled(self, n: int, done: list[list[Frame]]) -> None:
        """`n` bytes were read into the views `_rest` gave: step past what they filled."""
        frames = self._frames
        while n:
            left = len(frames[self._index]) - self._got
            if n < left:
                self._got += n
                return
            n -= left
            self._index += 1
            self._got = 0
        self._advance(done)

    def _small_read(self, frame: Frame | None) -> int:
        if frame is None:
            return PREFIX_READ
        return min(SCRATCH, len(frame) - self._got + PREFIX_READ)

    def _consume(self, data: memoryview, done: list[list[Frame]]) -> None:
        if self._opening is not None:
            data = self._open_stream(data)
        while data:
            if not self._frames:  # between messages, or in a prefix cut across reads
                data = self._begin(data, done)
                continue
            frame = self._frames[self._index]
            take = min(len(data), len(frame) - self._got)
            memoryview(frame)[self._got : self._got + take] = data[:take]
            self._got += take
            data = data[take:]
            self._advance(done)

    def _open_stream(self, data: memoryview) -> memoryview:
        """The stream's first bytes: SpeaksZeroMQ for a ZMTP signature; else what is to be
        parsed as framing (those held back to tell, then `data`'s rest). A stream that
        opens with 0xFF has its first 10 bytes held (`_opening`) until they tell."""
        opening = self._opening
        assert opening is not None
        take = min(len(data), zmtp.SIGNATURE_SIZE - len(opening))
        opening += data[:take]
        told = zmtp.verdict(opening)
        if told is None:
            return data[len(data) :]  # all held: wait for the rest of the signature
        if told:
            raise SpeaksZeroMQ("the peer speaks ZeroMQ (a ZMTP greeting), not robotd's framing")
        self._opening = None
        if len(opening) == take:  # nothing was held back: parse `data` itself
            return data
        return memoryview(bytes(opening) + bytes(data[take:]))  # once a stream, <= 4 KiB

    def _begin(self, data: memoryview, done: list[list[Frame]]) -> memoryview:
        """A message's start: its prefix parsed, the message cut straight out of `data`
        when it is all there (replies and pings come so: one read, one message), else its
        frames begun. Returns what of `data` is left to copy into them."""
        if self._prefix:  # a prefix cut across reads: gather what it still needs
            take = min(len(data), self._need - len(self._prefix))
            self._prefix += data[:take]
            data = data[take:]
            lengths = self._lengths(self._prefix)
            if lengths is None:
                self._need = self._prefix_size(self._prefix)
            else:
                self._open(lengths, done)
            return data
        lengths = self._lengths(data)
        if lengths is None:  # the prefix itself is cut short: gather it
            self._prefix = bytearray(data)
            self._need = self._prefix_size(data)
            return data[len(data) :]
        start = COUNT.size + LENGTH.size * len(lengths)
        if start + sum(lengths) > len(data):
            self._open(lengths, done)
            return data[start:]
        frames: list[Frame] = []
        for n in lengths:
            frames.append(bytearray(data[start : start + n]))
            start += n
        done.append(frames)
        return data[start:]

    def _open(self, lengths: Sequence[int], done: list[list[Frame]]) -> None:
        """Begin filling a message of frames of these lengths."""
        self._frames = [_buffer(n) for n in lengths]
        self._index = self._got = 0
        self._prefix = bytearray()
        self._need = COUNT.size
        self._advance(done)  # (frames of no bytes are filled already)

    @staticmethod
    def _prefix_size(prefix: bytes | bytearray | memoryview) -> int:
        """Bytes the prefix whose start is `prefix` needs (its count checked already)."""
        if len(prefix) < COUNT.size:
            return COUNT.size
        return COUNT.size + LENGTH.size * COUNT.unpack_from(prefix)[0]

    def _lengths(self, prefix: bytes | bytearray | memoryview) -> tuple[int, ...] | None:
        """The frame lengths a message's prefix declares (None: the prefix is not all
        there yet); StreamBroken for a count out of range or a total over max_bytes."""
        if len(prefix) < COUNT.size:
            return None
        (count,) = COUNT.unpack_from(prefix)
        if not 1 <= count <= framed.MAX_FRAMES:
            raise StreamBroken(f"the stream broke: a message of {count} frames")
        if len(prefix) < COUNT.size + LENGTH.size * count:
            return None
        if count < len(_LENGTHS):
            lengths = _LENGTHS[count].unpack_from(prefix, COUNT.size)
        else:
            lengths = struct.unpack_from(f"<{count}Q", prefix, COUNT.size)
        total = sum(lengths)
        if total > self.max_bytes:
            raise StreamBroken(
                f"the stream broke: a message of {total} bytes, over {self.max_bytes}"
            )
        return lengths

    def _advance(self, done: list[list[Frame]]) -> None:
        """Step past the frames filled; hand out the message once all are."""
        frames = self._frames
        while self._index < len(frames) and self._got == len(frames[self._index]):
            self._index += 1
            self._got = 0
        if frames and self._index == len(frames):
            done.append(frames)
            self._frames, self._index, self._got = [], 0, 0
