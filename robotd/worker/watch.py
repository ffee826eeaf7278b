"""What the worker's poll loop waits on: its ZeroMQ sockets, the act endpoint's
descriptors when it is a stream (robotd.stream.router), and each copy's channel and pidfd,
kept registered as peers and copies come and go; and the copies' traffic handled when
their channels are ready."""

from __future__ import annotations

import time
from typing import Any

import zmq

from robotd.stream.router import POLLIN, POLLOUT, StreamRouter
from robotd.worker.channel import ChannelClosed
from robotd.worker.death import Loss
from robotd.worker.pool import Pool
from robotd.worker.slots import Slot

BROKEN_S = 2.0


class Watch:
    """A zmq.Poller over `sockets` (POLLIN) and the copies of `pool`: their channels (POLLIN,
    and POLLOUT while a message waits to be written) and their pidfds (readable when a copy
    process ends)."""

    def __init__(
        self, pool: Pool, sockets: list[zmq.Socket], stream: StreamRouter | None = None
    ) -> None:
        self.pool = pool
        self.stream = stream
        self.poller = zmq.Poller()
        for sock in sockets:
            self.poller.register(sock, zmq.POLLIN)
        self._fds: dict[int, int] = {}  # descriptor -> flags registered
        self._pidfds: set[int] = set()
        self._channels: dict[int, Slot] = {}
        self._seen: tuple[int, tuple[bool, ...], int] | None = None  # registered for
        self._broken: dict[Slot, float] = {}  # channel ended, process not (yet): since when

    def poll(self, timeout_ms: int) -> dict[Any, int]:
        """Wait up to `timeout_ms`; what is ready (socket or descriptor -> events)."""
        copies = self.pool.copies
        writes = tuple(s.runner.channel.wants_write for s in copies.slots.values())
        seen = (copies.generation, writes, self.stream.generation if self.stream else 0)
        if seen != self._seen:  # a copy or a peer came or went, or has output
            self._seen = seen
            self._register()
        return dict(self.poller.poll(timeout_ms))

    def exits(self, ready: dict[Any, int]) -> bool:
        """A copy process ended (its pidfd is readable)."""
        return any(fd in ready for fd in self._pidfds)

    def _register(self) -> None:
        self._channels = self.pool.copies.channels()
        self._pidfds = set(self.pool.copies.fds())
        wanted = dict.fromkeys(self._pidfds, POLLIN)
        for fd, slot in self._channels.items():
            wanted[fd] = POLLIN | POLLOUT if slot.runner.channel.wants_write else POLLIN
        if self.stream is not None:
            wanted.update(self.stream.fds())
        for fd in self._fds.keys() - wanted.keys():
            self.poller.unregister(fd)
        for fd, flags in wanted.items():
            if self._fds.get(fd) != flags:
                self.poller.register(fd, flags)
        self._fds = wanted

    def copies(self, ready: dict[Any, int]) -> None:
        """The copies' traffic: write what waits, hand each message read to the pool. A
        copy's channel ends when it exits (its exit status tells why, a moment later); one
        whose channel ended BROKEN_S ago but which still runs is lost."""
        now = time.monotonic()
        for slot, since in list(self._broken.items()):
            if self.pool.slots.get(slot.identity) is not slot:
                del self._broken[slot]
            elif now - since > BROKEN_S and slot.runner.exited() is None:
                del self._broken[slot]
                self.pool.copies.lose(slot, Loss("crashed", "it closed its channel"), now)
        for fd, slot in self._channels.items():
            events = ready.get(fd, 0)
            channel = slot.runner.channel
            if events & POLLOUT:
                channel.flush()
            if not events & POLLIN:
                continue
            try:
                messages = channel.receive()
            except ChannelClosed:
                self._broken[slot] = now
                self._seen = None  # watch it no more
                continue
            for frames in messages:
                self.pool.on_message(slot, frames)
