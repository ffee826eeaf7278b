"""The act connection on a byte stream (`stream+tcp://`, `stream+ipc://`): what
robotd.link.dealer's LoopDealer does over ZeroMQ, with the same methods, on a plain socket
watched by the running asyncio loop.

Why not ZeroMQ here: a ZeroMQ round trip wakes each side's I/O thread as well as the
reader, and crosses the socket in 8 KiB batches; for an act carrying two camera frames
that alone costs several times what the same bytes cost on a socket written with one
`sendmsg` and read straight into the frames' buffers (bench/openpi.py, `zmq_floor`).

As with the DEALER (IMMEDIATE): nothing is queued while no connection is up, a send
waits until one is; a lost connection is dialled again every RECONNECT_S, and what was
in flight on it is never answered (its callers time out, as over ZeroMQ). Replies are
hostile: over `max_message_bytes` or a broken prefix closes the connection (a warning: the
worker misbehaves; a plain close or reset by the peer is logged as info) and it is dialled
again. A peer that greets as ZeroMQ does is named so (robotd.stream.zmtp), in
`last_error` until it answers; a loss for the same reason is logged once per REPEAT_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from robotd.link.dealer import DealerClosed
from robotd.repeats import Repeats
from robotd.stream import endpoint as ep
from robotd.stream import zmtp
from robotd.stream.framing import (
    FrameReader,
    FrameWriter,
    SpeaksZeroMQ,
    StreamBroken,
    StreamEnded,
)

log = logging.getLogger("robotd.link")

RECONNECT_S = 0.1  # as ZeroMQ's default reconnect interval
MAX_QUEUED = 64 << 20  # bytes waiting to be written before a send waits
REPEAT_S = 10.0  # a loss of a connection to an endpoint, for one reason: logged once a while
_LOSSES = Repeats(REPEAT_S)  # across dealers: a hello retried makes a new one each time


class StreamDealer:
    """A connection to `endpoint`; `on_message(frames)` gets each message as it arrives
    (a list of bytearrays). Use it from the loop's thread only; `open` in a running asyncio
    loop; `close` is idempotent."""

    def __init__(
        self,
        endpoint: str,
        on_message: Callable[[list[Any]], None],
        *,
        max_message_bytes: int,
    ) -> None:
        self.endpoint = endpoint
        self.on_message = on_message
        self.max_message_bytes = max_message_bytes
        self._addr = ep.parse(endpoint)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None  # connected
        self._dialling: socket.socket | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._reader = FrameReader(max_message_bytes)
        self._writer = FrameWriter()
        self._writing = False  # the loop watches the socket for writability
        self._writable: anyio.Event | None = None  # set when a waiting send may go
        self.connections = 0  # connections made (the first, then each reconnect)
        self.last_error = ""  # why the last dial failed ("" once one is up)
        self._mismatch = ""  # the peer speaks ZeroMQ: kept in last_error until it answers
        # told why, each time a connection is dropped: what was sent on it is never answered
        self.on_lost: Callable[[str], None] | None = None

    @property
    def is_open(self) -> bool:
        return self._loop is not None

    def open(self) -> None:
        """Start connecting (and keep connected) on the running loop."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._dial()

    def try_send(self, frames: Sequence[Any], *, copy: bool = False) -> bool:
        """Send one message if a connection is up and can take it now (False: nothing was
        sent). DealerClosed if closed."""
        if self._loop is None:
            raise DealerClosed("the connection is closed")
        sock = self._sock
        if sock is None or self._writer.pending_bytes > MAX_QUEUED:
            return False
        self._write(sock, frames)
        return True

    async def send(self, frames: Sequence[Any], *, copy: bool = False) -> None:
        """Send one message, waiting while no connection can take it. DealerClosed if the
        dealer is or gets closed; cancellable (then nothing was sent)."""
        while not self.try_send(frames):
            self._writable = event = self._writable or anyio.Event()
            await event.wait()

    def close(self) -> None:
        """Close the connection and stop dialling; a send waiting raises DealerClosed."""
        self._hang_up()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._loop = None
        self._wake()

    # ---- connecting ---------------------------------------------------------------------

    def _dial(self) -> None:
        self._retry = None
        loop = self._loop
        if loop is None:
            return
        sock = ep.connect_socket(self._addr)
        try:
            sock.connect(self._addr.address)
        except (BlockingIOError, InterruptedError):
            self._dialling = sock
            loop.add_writer(sock.fileno(), self._dialled)
        except OSError as err:
            sock.close()
            self.last_error = (err.strerror or str(err)).lower()
            self._retry = loop.call_later(RECONNECT_S, self._dial)
        else:
            self._up(sock)

    def _dialled(self) -> None:
        sock, self._dialling = self._dialling, None
        if sock is None or self._loop is None:
            return
        self._loop.remove_writer(sock.fileno())
        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            sock.close()
            self.last_error = os.strerror(code).lower()
            self._retry = self._loop.call_later(RECONNECT_S, self._dial)
        else:
            self._up(sock)

    def _up(self, sock: socket.socket) -> None:
        assert self._loop is not None
        self._sock = sock
        self.connections += 1
        self.last_error = self._mismatch
        self._reader = FrameReader(self.max_message_bytes)
        self._loop.add_reader(sock.fileno(), self._readable)
        self._wake()

    def _lost(self, why: str, level: int = logging.INFO) -> None:
        """The connection ended or broke: drop it (and what it had not written), dial again."""
        said = _LOSSES.say(f"{self.endpoint}: {why}")
        if said is not None:
            tail = said.tail
            log.log(level, "act connection to %s: %s; reconnecting%s", self.endpoint, why, tail)
        self._hang_up()
        if self._loop is not None:
            self._retry = self._loop.call_later(RECONNECT_S, self._dial)
        if self.on_lost is not None:
            self.on_lost(why)

    def _hang_up(self) -> None:
        loop = self._loop
        for sock in (self._sock, self._dialling):
            if sock is None:
                continue
            if loop is not None:
                with contextlib.suppress(RuntimeError, ValueError, OSError):  # loop gone
                    loop.remove_reader(sock.fileno())
                    loop.remove_writer(sock.fileno())
            sock.close()
        self._sock = self._dialling = None
        self._writing = False
        self._writer.clear()

    # ---- traffic ------------------------------------------------------------------------

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            messages = self._reader.receive(sock)
        except SpeaksZeroMQ:
            self.last_error = self._mismatch = zmtp.zeromq_peer(self.endpoint)
            self._lost(self._mismatch, logging.WARNING)
            return
        except StreamEnded as why:  # a worker restarting closes it: nothing to warn about
            self._lost(str(why))
            return
        except StreamBroken as why:  # the framing broken (or the socket failed): misbehaving
            self._lost(str(why), logging.WARNING)
            return
        if messages and self._mismatch:
            self.last_error = self._mismatch = ""
        for frames in messages:
            try:
                self.on_message(frames)
            except Exception:  # a bug in the handler must not kill the loop's callback
                log.exception("handling a message from %s failed", self.endpoint)

    def _write(self, sock: socket.socket, frames: Sequence[Any] | None = None) -> None:
        """Write `frames` (None: what waits) as far as the socket takes them; the loop
        watches the socket for room while anything waits."""
        try:
            if frames is None:
                self._writer.flush(sock)
            else:
                self._writer.write(sock, frames)
        except OSError as err:
            self._lost(f"writing failed: {err}")
            return
        loop = self._loop
        if loop is None:
            return
        if self._writer.wants_write and not self._writing:
            loop.add_writer(sock.fileno(), self._on_writable)
            self._writing = True
        elif not self._writer.wants_write and self._writing:
            loop.remove_writer(sock.fileno())
            self._writing = False
            self._wake()

    def _on_writable(self) -> None:
        if self._sock is not None:
            self._write(self._sock)

    def _wake(self) -> None:
        if self._writable is not None:
            self._writable.set()
            self._writable = None
