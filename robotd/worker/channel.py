"""A copy's channel: a Unix stream socket pair between the worker's main process and one copy
of the policy, carrying robotd.worker.pipe messages (robotd.framed frames).

No ZeroMQ on this hop: a ZeroMQ message between two processes wakes four threads (each
side's I/O thread, then the reader) and crosses its socket in 8 KiB batches, which costs a
round trip several times what one `sendmsg` does (bench/openpi.py's native link). Here a
message is one `sendmsg` straight from its frames' memory (a frame the worker received
from a client goes as it is), and is read straight into the buffers that become the arrays.

On the stream each message is a prefix, little-endian: u32 frame count n (1..MAX_FRAMES),
n u64 frame lengths; then the n frames' bytes back to back. From the worker, a length with
its top bit set (IN_ARENA) is a frame not in the stream but in the copy's arena
(robotd.worker.arena), at the offset where the message's arena frames before it end; the
arena's descriptor comes with the first message that needs a new one (SCM_RIGHTS).

`Channel` is the worker's end (non-blocking: its poll loop never waits on a copy; what the
socket cannot take yet is kept and written when it can, `flush`); what it reads is bounded
(`max_bytes` a message: a copy runs the policy's code, so its answers are not taken on
trust), and a broken prefix or the copy's end is ChannelClosed. `CopyEnd` is the copy's
end (blocking: the copy has nothing else to do).
"""

from __future__ import annotations

import array
import logging
import os
import socket
import struct
import sys
from collections import deque
from collections.abc import Sequence
from typing import Any

from robotd import framed, wire
from robotd.worker import arena
from robotd.worker.arena import Arena, ArenaView

COUNT = struct.Struct("<I")
LENGTH = struct.Struct("<Q")
SOCKET_BUFFER = 4 << 20  # a window of camera frames in one write (capped by wmem_max)
READ_CHUNK = 256 << 10
READS_PER_TURN = 16  # 4 MiB at most per receive(): a huge answer cannot hold the poll loop
MAX_FROM_COPY = wire.MAX_MESSAGE_BYTES  # as on any socket: the daemon refuses huge chunks


IN_ARENA = 1 << 63

log = logging.getLogger("robotd.worker")


class ChannelClosed(Exception):
    """The peer closed its end, or broke the stream's framing (the message says how)."""


def pair() -> tuple[socket.socket, socket.socket]:
    """(worker end, copy end), both with large buffers; neither inheritable."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for s in (ours, theirs):
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            s.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
    return ours, theirs


def _views(frames: Sequence[Any]) -> list[memoryview]:
    views = [memoryview(f).cast("B") for f in frames]
    if not 1 <= len(views) <= framed.MAX_FRAMES:
        raise ValueError(f"a message of {len(views)} frames (1..{framed.MAX_FRAMES})")
    return views


def _head(lengths: Sequence[int]) -> memoryview:
    return memoryview(COUNT.pack(len(lengths)) + struct.pack(f"<{len(lengths)}Q", *lengths))


def _check_count(count: int) -> None:
    if not 1 <= count <= framed.MAX_FRAMES:
        raise ChannelClosed(f"the stream broke: a message of {count} frames")


def _parse_lengths(count: int, data: bytes | bytearray | memoryview, max_bytes: int) -> list[int]:
    lengths = list(struct.unpack_from(f"<{count}Q", data))
    if sum(n & ~IN_ARENA for n in lengths) > max_bytes:
        raise ChannelClosed(f"a message of {sum(lengths)} bytes, over {max_bytes}")
    return lengths


class Channel:
    """The worker's end of a copy's channel (non-blocking)."""

    def __init__(self, sock: socket.socket, max_bytes: int = MAX_FROM_COPY) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.max_bytes = max_bytes
        self._out: deque[memoryview] = deque()
        self._in = bytearray()
        self._chunk = bytearray(READ_CHUNK)
        self.closed = False
        self._arena = Arena()
        self._arena_busy = False  # a message in it that the copy has not answered yet
        self._arena_ok = True
        self._fd: int | None = None  # a new arena's descriptor, to go with the next write

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def wants_write(self) -> bool:
        """Part of a message waits for the socket to take it (poll for POLLOUT)."""
        return bool(self._out)

    def send(self, frames: Sequence[Any]) -> None:
        """Queue one message and write what the socket takes now (never blocks). Its large
        frames go through the arena when it is free (the copy answered what was in it)."""
        if self.closed:
            return
        views = _views(frames)
        lengths = [v.nbytes for v in views]
        big = [i for i, n in enumerate(lengths) if n >= arena.MIN_FRAME]
        free = big and not self._out and not self._arena_busy and self._arena_ok
        if free and sum(lengths[i] for i in big) <= arena.MAX_BYTES:
            try:
                self._fd = self._arena.place([views[i] for i in big])
            except OSError as err:  # no memfd here (or no memory): the socket carries all
                log.warning("copies' frames go through their sockets: no arena (%s)", err)
                self._arena_ok = False
            else:
                self._arena_busy = True
                for i in big:
                    lengths[i] |= IN_ARENA
                views = [v for n, v in zip(lengths, views) if not n & IN_ARENA]
        self._out.extend([_head(lengths), *views])
        self.flush()

    def flush(self) -> None:
        """Write what waits, as far as the socket takes it."""
        while self._out and not self.closed:
            fds = [] if self._fd is None else [_rights(self._fd)]
            try:
                sent = self.sock.sendmsg(list(self._out)[:64], fds)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the copy is gone: its end will be seen by the poll loop
                self._out.clear()
                return
            self._fd = None  # it went with the message's first byte
            while sent and self._out:
                head = self._out[0]
                if sent >= head.nbytes:
                    sent -= head.nbytes
                    self._out.popleft()
                else:
                    self._out[0] = head[sent:]
                    sent = 0

    def receive(self) -> list[list[bytes]]:
        """The messages complete so far (each a list of frames); ChannelClosed at the
        copy's end or if it broke the framing."""
        for _ in range(READS_PER_TURN):
            if self.closed:
                break
            try:
                n = self.sock.recv_into(self._chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:
                self.closed = True
                raise ChannelClosed(f"the copy's channel failed: {err}") from None
            if n == 0:
                self.closed = True
                break
            self._in += memoryview(self._chunk)[:n]
            if n < len(self._chunk):
                break
        try:
            out = self._complete()
        except ChannelClosed:
            self.closed = True
            raise
        if out:
            self._arena_busy = False  # the copy answered: it read what the arena held
        if self.closed and not out:
            raise ChannelClosed("the copy closed its channel")
        return out

    def _complete(self) -> list[list[bytes]]:
        out, data = [], self._in
        while len(data) >= COUNT.size:
            (count,) = COUNT.unpack_from(data)
            _check_count(count)
            head = COUNT.size + LENGTH.size * count
            if len(data) < head:
                break
            lengths = _parse_lengths(count, memoryview(data)[COUNT.size : head], self.max_bytes)
            if len(data) < head + sum(lengths):
                break
            frames, at = [], head
            for n in lengths:
                frames.append(bytes(data[at : at + n]))
                at += n
            del data[:at]
            out.append(frames)
        return out

    def close(self) -> None:
        self.closed = True
        self._out.clear()
        self.sock.close()
        self._arena.close()


def _rights(fd: int) -> tuple[int, int, bytes]:
    return (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())


class CopyEnd:
    """The copy's end of its channel (blocking)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self.sock = sock
        self._last: list[bytearray] = []  # the previous message's buffers
        self.fresh_bytes = 0  # frame buffers allocated (not read into again)
        self._arena = ArenaView()

    def send(self, frames: Sequence[Any]) -> None:
        """One message, all through the socket (blocks until it has taken it)."""
        body = _views(frames)
        views = [_head([v.nbytes for v in body]), *body]
        while views:
            sent = self.sock.sendmsg(views[:64])
            while sent:
                if sent >= views[0].nbytes:
                    sent -= views.pop(0).nbytes
                else:
                    views[0] = views[0][sent:]
                    sent = 0

    def recv(self) -> list[bytearray]:
        """One message, each frame read straight into a buffer of its own (which becomes
        its arrays' memory); ChannelClosed when the worker has gone.

        The previous message's buffers that nothing holds any more (no array the policy
        kept views them) are read into again: fresh memory costs a page fault per 4 KiB,
        more than reading a camera frame into it."""
        spare: dict[int, list[bytearray]] = {}
        for buf in self._last:
            if sys.getrefcount(buf) == 3:  # this loop, the list, getrefcount's argument
                spare.setdefault(len(buf), []).append(buf)
        self._last = []
        count = COUNT.unpack(self._first())[0]
        _check_count(count)
        lengths = _parse_lengths(count, self._exact(LENGTH.size * count), 1 << 62)
        frames, at = [], 0
        for raw in lengths:
            n = raw & ~IN_ARENA
            free = spare.get(n)
            if not free:
                self.fresh_bytes += n
            buf = free.pop() if free else bytearray(n)
            if raw & IN_ARENA:
                try:
                    self._arena.read(at, buf)
                except ValueError as err:
                    raise ChannelClosed(f"the stream broke: {err}") from None
                at += n
            else:
                self._exact(n, buf)
            frames.append(buf)
        self._last = list(frames)
        return frames

    def _first(self) -> bytearray:
        """A message's first bytes, with the arena's descriptor if one comes along."""
        data, ancillary, _flags, _ = self.sock.recvmsg(COUNT.size, socket.CMSG_SPACE(16))
        if not data:
            raise ChannelClosed("the worker closed the channel")
        fds = array.array("i")
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        for fd in fds[:-1]:
            os.close(fd)
        if fds:
            self._arena.adopt(fds[-1])
        rest = self._exact(COUNT.size - len(data)) if len(data) < COUNT.size else b""
        return bytearray(data) + rest

    def _exact(self, n: int, buf: bytearray | None = None) -> bytearray:
        buf = bytearray(n) if buf is None else buf
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ChannelClosed("the worker closed the channel")
            got += k
        return buf

    def close(self) -> None:
        self.sock.close()
        self._arena.close()
