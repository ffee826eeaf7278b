"""A ZeroMQ DEALER driven by the running asyncio loop itself, without zmq.asyncio.

The socket's ZMQ_FD is watched by a reader callback of the loop: when it fires, every
message waiting is read (without blocking) and handed to `on_message`, in the loop's
thread, with no task, future or poller per message. Sends never block: a message the socket
cannot take yet (no peer connected, or its queue full) waits until it can. This is what the
act link's round trip costs the least with: one epoll wake-up per reply.

ZMQ_FD only says "something changed": after any send or receive the socket's ZMQ_EVENTS is
looked at again, since the operation may have taken the wake-up of a message waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import zmq

from robotd import framed

log = logging.getLogger("robotd.link")

DRAIN_MAX = 64  # messages read per wake-up before the loop gets a turn (a flood cannot hog it)


class DealerClosed(Exception):
    """The socket was closed (before or while a send waited)."""


class LoopDealer:
    """A DEALER connected to `endpoint`; `on_message(frames)` gets each message as it
    arrives (a list of bytes). Use it from the loop's thread only; `open` in a running
    asyncio loop; `close` is idempotent."""

    def __init__(
        self,
        endpoint: str,
        on_message: Callable[[list[bytes]], None],
        *,
        max_message_bytes: int,
    ) -> None:
        self.endpoint = endpoint
        self.on_message = on_message
        self.max_message_bytes = max_message_bytes
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = -1
        self._writable: anyio.Event | None = None  # set when a waiting send may go

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    def open(self) -> None:
        """Create the socket, connect, and watch it on the running loop."""
        if self._sock is not None:
            return
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # Queue nothing for a worker that is not there: a send waits (and times out)
        # instead of delivering a stale request to whoever binds later.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.copy_threshold = framed.COPY_BELOW  # sent with copy=False: see there
        sock.connect(self.endpoint)
        self._sock = sock
        self._fd = sock.getsockopt(zmq.FD)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._ready)

    def try_send(self, frames: Sequence[Any], *, copy: bool = False) -> bool:
        """Send one message (its frames) if the socket can take it now (False: it cannot;
        nothing was sent). DealerClosed if the socket is closed."""
        sock = self._sock
        if sock is None:
            raise DealerClosed("the socket is closed")
        try:
            # The first frame taken means all are: ZeroMQ queues whole messages.
            sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return False
        if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # the send took a reply's wake-up
            self._ready()
        return True

    async def send(self, frames: Sequence[Any], *, copy: bool = False) -> None:
        """Send one message, waiting while the socket cannot take it. DealerClosed if the
        socket is or gets closed; cancellable (then nothing was sent)."""
        while not self.try_send(frames, copy=copy):
            assert self._sock is not None
            await self._until_writable(self._sock)

    async def _until_writable(self, sock: zmq.Socket) -> None:
        while self._sock is sock and not sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
            self._writable = event = self._writable or anyio.Event()
            await event.wait()

    def _ready(self) -> None:
        """The loop's reader callback: read what waits, wake a waiting send."""
        for _ in range(DRAIN_MAX):
            sock = self._sock
            if sock is None:
                return
            events = sock.getsockopt(zmq.EVENTS)
            if events & zmq.POLLOUT and self._writable is not None:
                self._writable.set()
                self._writable = None
            if not events & zmq.POLLIN:
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)  # replies are small: bytes
            except zmq.Again:
                return
            try:
                self.on_message(frames)
            except Exception:  # a bug in the handler must not kill the loop's callback
                log.exception("handling a message from %s failed", self.endpoint)
        if self._loop is not None:
            self._loop.call_soon(self._ready)  # more may wait: after the loop's other work

    def close(self) -> None:
        """Stop watching and close the socket; a send waiting raises DealerClosed."""
        if self._loop is not None and self._fd >= 0:
            with contextlib.suppress(RuntimeError, ValueError, OSError):  # the loop is gone
                self._loop.remove_reader(self._fd)
        self._fd = -1
        if self._writable is not None:
            self._writable.set()
            self._writable = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self._loop = None
