"""The worker's act endpoint on a byte stream: what a ZeroMQ ROUTER does for it, on a
listening socket of its own.

Each accepted connection is a peer with an identity of its own (5 bytes, as a ROUTER's);
`receive` hands out each complete message as ``[identity, *frames]`` and
`send_multipart([identity, *frames])` answers that peer, like a ROUTER. A message for a
peer that is gone is dropped, as a ROUTER drops it. Nothing here blocks: the worker's poll
loop waits on `fds()` (re-registered whenever `generation` changes) and hands what is
ready to `receive`.

Peers are hostile until checked: at most MAX_PEERS at once (more are closed at accept), a
message over `max_message_bytes` or a broken prefix closes its peer, reads are bounded per
turn, and a reply to a peer that does not read its replies is dropped (counted, logged)
while more than MAX_PENDING bytes wait behind the one being written, as a ROUTER drops
messages past its high-water mark: a slow reader of one huge reply keeps its connection.
A ZeroMQ client (its ZMTP greeting: robotd.stream.zmtp) is closed with a line saying to
connect with stream+…, at most once a minute per host (robotd.repeats).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from robotd.repeats import Repeats
from robotd.stream import endpoint as ep
from robotd.stream.framing import (
    FrameReader,
    FrameWriter,
    SpeaksZeroMQ,
    StreamBroken,
    StreamEnded,
)

log = logging.getLogger("robotd.worker")

MAX_PEERS = 64
MAX_PENDING = 64 << 20
BACKLOG = 16
ZEROMQ_EVERY_S = 60.0  # a ZeroMQ client redials every 100 ms: one line a minute per host
# The poller's flags as plain ints: zmq's are enum flags, and `|` on those costs microseconds.
POLLIN, POLLOUT, POLLERR = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.POLLERR)


@dataclass(eq=False)
class _Peer:
    sock: socket.socket
    identity: bytes
    reader: FrameReader
    writer: FrameWriter = field(default_factory=FrameWriter)
    dropped: int = 0  # replies not queued: over MAX_PENDING waited behind the one in progress


class StreamRouter:
    """Listens on a stream endpoint (robotd.stream.endpoint); see the module doc."""

    def __init__(self, endpoint: str, *, max_message_bytes: int) -> None:
        self.endpoint = endpoint
        self.max_message_bytes = max_message_bytes
        self.generation = 0  # changes when fds() would answer differently
        self.refused_peers = 0
        self.bound = endpoint  # once bound: the endpoint listened on (tcp port 0: chosen)
        self._addr = ep.parse(endpoint, bind=True)
        self._listener: socket.socket | None = None
        self._peers: dict[int, _Peer] = {}  # descriptor -> peer
        self._by_identity: dict[bytes, _Peer] = {}
        self._ids = itertools.count(1)
        self._zeromq_clients = Repeats(ZEROMQ_EVERY_S)

    def bind(self) -> str:
        """Listen; the endpoint bound (for tcp port 0, the port chosen). OSError if not."""
        addr = self._addr
        sock = socket.socket(addr.family, socket.SOCK_STREAM)
        try:
            if addr.family == socket.AF_UNIX:
                path = str(addr.address)
                if _is_socket(path):
                    os.unlink(path)  # a stale socket of an earlier run, as libzmq does
                elif os.path.lexists(path):
                    raise OSError(f"{path} exists and is not a socket: not replacing it")
            else:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr.address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._listener = sock
        self.generation += 1
        self.bound = ep.bound_endpoint(sock, addr)
        return self.bound

    def fds(self) -> dict[int, int]:
        """Descriptor -> the zmq.Poller flags to wait for."""
        out: dict[int, int] = {}
        if self._listener is not None:
            out[self._listener.fileno()] = POLLIN
        for fd, peer in self._peers.items():
            out[fd] = POLLIN | POLLOUT if peer.writer.wants_write else POLLIN
        return out

    def receive(self, ready: dict[Any, int]) -> list[list[Any]]:
        """Accept, write and read what `ready` (a poll's answer) says can go; the messages
        completed, each ``[identity, *frames]``."""
        out: list[list[Any]] = []
        listener = self._listener
        if listener is not None and ready.get(listener.fileno(), 0) & POLLIN:
            self._accept(listener)
        for fd, peer in list(self._peers.items()):
            events = ready.get(fd, 0)
            if not events:
                continue
            if events & POLLOUT:
                self._write(peer)
            if events & (POLLIN | POLLERR) and fd in self._peers:
                try:
                    messages = peer.reader.receive(peer.sock)
                except SpeaksZeroMQ:
                    self._zeromq_client(peer)
                    continue
                except StreamBroken as why:
                    self._drop(peer, str(why), quiet=isinstance(why, StreamEnded))
                    continue
                out.extend([peer.identity, *frames] for frames in messages)
        return out

    def send_multipart(self, frames: Sequence[Any], copy: bool = False) -> None:
        """One message to the peer `frames[0]` names (dropped if it is gone)."""
        peer = self._by_identity.get(bytes(frames[0]))
        if peer is None:
            return
        if peer.writer.backlog_bytes > MAX_PENDING:  # as a ROUTER past its high-water mark
            peer.dropped += 1
            if _worth_a_line(peer.dropped):
                log.warning(
                    "act endpoint %s: a peer reads its replies too slowly: %d dropped "
                    "(over %d bytes already waiting for it)",
                    self.endpoint,
                    peer.dropped,
                    MAX_PENDING,
                )
            return
        self._write(peer, frames[1:])

    def close(self) -> None:
        for peer in list(self._peers.values()):
            self._drop(peer, "", quiet=True)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            path = ep.ipc_file(self.endpoint)
            if path is not None and _is_socket(str(path)):
                with contextlib.suppress(OSError):
                    path.unlink()
        self.generation += 1

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(BACKLOG):
            try:
                sock, _addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of descriptors, say: the next poll tries again
                log.warning("act endpoint %s: accept failed: %s", self.endpoint, err)
                return
            if len(self._peers) >= MAX_PEERS:
                self.refused_peers += 1
                if _worth_a_line(self.refused_peers):
                    log.warning(
                        "act endpoint %s: refused a connection: %d peers already (%d refused)",
                        self.endpoint,
                        MAX_PEERS,
                        self.refused_peers,
                    )
                sock.close()
                continue
            sock.setblocking(False)
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            identity = b"\x00" + next(self._ids).to_bytes(4, "big")
            peer = _Peer(sock, identity, FrameReader(self.max_message_bytes))
            self._peers[sock.fileno()] = peer
            self._by_identity[identity] = peer
            self.generation += 1

    def _write(self, peer: _Peer, frames: Sequence[Any] | None = None) -> None:
        """Write `frames` (None: what waits) as far as the peer's socket takes them."""
        had = peer.writer.wants_write
        try:
            if frames is None:
                peer.writer.flush(peer.sock)
            else:
                peer.writer.write(peer.sock, frames)
        except OSError as err:
            self._drop(peer, f"writing failed: {err}", quiet=True)
            return
        if peer.writer.wants_write != had:
            self.generation += 1

    def _zeromq_client(self, peer: _Peer) -> None:
        """The peer greeted as a ZeroMQ socket does: say what to connect with (the address
        it reached, as a stream endpoint), once a while per host, and close it."""
        there = _peer_address(peer.sock)
        said = self._zeromq_clients.say(there.rpartition(":")[0])
        if said is not None:
            log.warning(
                "a ZeroMQ client%s connected to the stream endpoint %s: connect with %s "
                "(robotd's stream framing), or serve the worker on %s for ZeroMQ; closed it%s",
                f" from {there}" if there else "",
                self.bound,
                self._reached(peer.sock),
                ep.zmq_equivalent(self.bound),
                said.tail,
            )
        self._drop(peer, "", quiet=True)

    def _reached(self, sock: socket.socket) -> str:
        """The stream endpoint a client reached on `sock`: for tcp the address it connected
        to (not a wildcard bound), for ipc the socket's path."""
        if sock.family == socket.AF_UNIX:
            return self.bound
        try:
            return ep.bound_endpoint(sock, self._addr)
        except OSError:
            return self.bound

    def _drop(self, peer: _Peer, why: str, *, quiet: bool = False) -> None:
        if not quiet:
            log.warning("act endpoint %s: closed a peer: %s", self.endpoint, why)
        self._peers.pop(peer.sock.fileno(), None)
        self._by_identity.pop(peer.identity, None)
        peer.writer.clear()
        peer.sock.close()
        self.generation += 1


def _worth_a_line(count: int) -> bool:
    """Log the 1st, 10th, 100th and every 1000th of a repeated event, not each."""
    return count in (1, 10, 100) or count % 1000 == 0


def _peer_address(sock: socket.socket) -> str:
    """`host:port` of a tcp peer ("" for a unix one, whose end is unnamed, or when gone)."""
    try:
        addr = sock.getpeername()
    except OSError:
        return ""
    if not isinstance(addr, tuple):
        return ""
    return f"[{addr[0]}]:{addr[1]}" if sock.family == socket.AF_INET6 else f"{addr[0]}:{addr[1]}"


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False
