"""The daemon's side of the act connection to a policy worker (docs/protocol.md).

`PolicyClient` is used from the main process's async lane (anyio on uvloop). Several
requests may be in flight: each carries an id and its reply is matched by id. There is no
background task: whichever caller is waiting receives from the socket and hands every reply
it reads to its owner, and when it leaves (answered, timed out or cancelled) another waiter
takes over. Every call is bounded by a timeout, so a dead worker cannot hang the caller:
it raises TimeoutError. A worker's error reply raises PolicyError with its code; a reply
that breaks the protocol raises PolicyError with code "bad_reply" naming the field.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio
import zmq
import zmq.asyncio

from robotd import wire
from robotd.link.replies import (
    ActResult,
    Handshake,
    PolicyError,
    parse_act_result,
    parse_handshake,
    unwrap,
)

log = logging.getLogger("robotd.link")

__all__ = ["ActResult", "Handshake", "PolicyClient", "PolicyError"]

ABANDONED_KEPT = 256  # ids of requests given up (timed out), to tell a late reply from junk


@dataclass(slots=True)
class _Pending:
    done: bool = False
    reply: dict[str, Any] | None = None
    error: PolicyError | None = None
    wake: anyio.Event = field(default_factory=anyio.Event)


class PolicyClient:
    """A DEALER connected to one worker's ROUTER endpoint.

    `timeout_s` bounds every call (overridable per act). Not thread-safe: use it from the
    event loop's thread. `close()` is idempotent.
    """

    def __init__(self, endpoint: str, *, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.late_replies = 0  # replies to requests already given up (timed out): dropped
        self.unknown_replies = 0  # replies naming no request this client made: dropped
        self._abandoned: deque[int] = deque(maxlen=ABANDONED_KEPT)
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._send_lock = anyio.Lock()
        self._raw: zmq.Socket | None = None  # sync view of the same socket, for NOBLOCK reads
        self._receiving = False  # one caller at a time reads the socket for everyone
        # Scopes of the socket waits in progress, cancelled by close(): closing the socket
        # under a pending send or poll would otherwise cancel the task from outside anyio.
        self._poll_scope: anyio.CancelScope | None = None
        self._send_scope: anyio.CancelScope | None = None
        self.bytes_sent = 0  # request bytes sent, for the benchmarks

    async def connect(self, *, observe: bool = False) -> Handshake:
        """Connect and say hello; returns the worker's contract and endpoints. `observe`:
        this client uploads observations, so ask for the observe endpoint (a worker tells
        only clients that ask)."""
        if self._sock is None:
            self._ctx = zmq.asyncio.Context()
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            # Queue nothing for a worker that is not there: a send waits (and times out)
            # instead of delivering a stale request to whoever binds later.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
            sock.connect(self.endpoint)
            self._sock = sock
            self._raw = zmq.Socket.shadow(sock.underlying)
        hello: dict[str, Any] = {"cmd": "hello", "observe": True} if observe else {"cmd": "hello"}
        result = await self._request(hello, self.timeout_s)
        return parse_handshake(result)

    async def act(
        self,
        episode: str,
        step: int,
        steps: list[int],
        observations: list[dict[str, Any]],
        *,
        timeout_s: float | None = None,
        rtc: dict[str, Any] | None = None,
    ) -> ActResult:
        """Ask for a chunk computed from `step`; `steps`/`observations` are the window;
        `rtc` the frozen prefix (robotd.link.rtc), sent when given."""
        message: dict[str, Any] = {
            "cmd": "act",
            "episode": episode,
            "step": step,
            "steps": list(steps),
            "observations": list(observations),
        }
        if rtc is not None:
            message["rtc"] = rtc
        started = time.perf_counter()
        result = await self._request(message, self.timeout_s if timeout_s is None else timeout_s)
        rtt_ms = (time.perf_counter() - started) * 1e3
        return parse_act_result(result, episode, step, rtt_ms)

    async def act_steps(
        self,
        episode: str,
        step: int,
        steps: list[int],
        reads: list[list[str]],
        *,
        inline: list[dict[str, Any]] | None = None,
        release_below: int | None = None,
        wait_s: float | None = None,
        timeout_s: float | None = None,
        rtc: dict[str, Any] | None = None,
    ) -> ActResult:
        """Ask for a chunk computed from `step`, naming the window (`reads[i]`: the keys read
        at `steps[i]`) that the worker holds from uploads; `inline` carries uploads
        ({"step", "values", "frames"}) the worker lacks. `release_below`: no later act of
        the episode reads steps below it. `wait_s`: how long the worker waits for missing
        steps before answering PolicyError "missing_steps" (see PolicyError.missing).
        `rtc`: the frozen prefix, as for `act`."""
        message: dict[str, Any] = {
            "cmd": "act",
            "episode": episode,
            "step": step,
            "steps": list(steps),
            "reads": [list(r) for r in reads],
        }
        if inline:
            message["inline"] = inline
        if release_below is not None:
            message["release_below"] = release_below
        if wait_s is not None:
            message["wait_s"] = wait_s
        if rtc is not None:
            message["rtc"] = rtc
        started = time.perf_counter()
        result = await self._request(message, self.timeout_s if timeout_s is None else timeout_s)
        rtt_ms = (time.perf_counter() - started) * 1e3
        return parse_act_result(result, episode, step, rtt_ms)

    async def ping(self, episode: str | None = None, *, timeout_s: float) -> dict[str, Any]:
        """The worker's heartbeat (answered by its poll loop whatever the policy does); with
        `episode`, its word on that episode too (robotd.link.replies.ping_episode)."""
        message: dict[str, Any] = {"cmd": "ping"}
        if episode:
            message["episode"] = episode
        return await self._request(message, timeout_s)

    async def params(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Read (no changes) or set the policy's inference parameters; they apply from the
        next episode on. PolicyError "bad_params" names what was refused."""
        message: dict[str, Any] = {"cmd": "params"}
        if changes:
            message["set"] = changes
        return await self._request(message, self.timeout_s)

    async def end_episode(self, episode: str) -> None:
        """Tell the worker the episode ended (it calls the policy's on_episode_end)."""
        await self._request({"cmd": "end_episode", "episode": episode}, self.timeout_s)

    async def close(self) -> None:
        """Drop the connection; requests still waiting fail with PolicyError "closed"."""
        for pending in self._pending.values():
            _settle(pending, error=PolicyError("closed", "the client was closed"))
        self._pending.clear()
        for scope in (self._poll_scope, self._send_scope):
            if scope is not None:
                scope.cancel()
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = self._raw = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def _request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._sock is None:
            raise PolicyError("closed", "not connected (call connect() first)")
        rid = next(self._ids)
        pending = self._pending[rid] = _Pending()
        data = wire.packb({"id": rid, **message})
        self.bytes_sent += len(data)
        try:
            with anyio.fail_after(timeout_s):
                async with self._send_lock:
                    if not pending.done and self._sock is not None:  # not closed meanwhile
                        with anyio.CancelScope() as self._send_scope:
                            try:
                                await self._sock.send(data)
                            finally:
                                self._send_scope = None
                await self._await_reply(pending)
        finally:
            if self._pending.pop(rid, None) is not None and not pending.done:
                self._abandoned.append(rid)  # a reply may still come: it will be late
        if pending.error is not None:
            raise pending.error
        assert pending.reply is not None
        return unwrap(pending.reply, message["cmd"])

    async def _await_reply(self, pending: _Pending) -> None:
        while not pending.done:
            if self._receiving:  # someone else reads: wait for our reply or for them to leave
                await pending.wake.wait()
                pending.wake = anyio.Event()
                continue
            self._receiving = True
            try:
                while not pending.done:
                    await self._receive()
            finally:
                self._receiving = False
                for other in self._pending.values():  # hand the reading over to a waiter
                    other.wake.set()

    async def _receive(self) -> None:
        """Wait for replies, then read all that are there and dispatch them.

        Waiting is a poll, and reading never blocks: a caller cancelled (timed out) while
        it waits consumes nothing, so no other caller's reply is lost with it.
        """
        assert self._sock is not None
        with anyio.CancelScope() as self._poll_scope:
            try:
                await self._sock.poll(flags=zmq.POLLIN)
            finally:
                self._poll_scope = None
        while self._raw is not None:
            try:
                data = self._raw.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        """Hand one reply to the request it answers."""
        try:
            reply = wire.unpackb(data)
        except wire.WireError as err:
            log.warning("dropped an undecodable reply from %s: %s", self.endpoint, err)
            return
        rid = reply.get("id") if isinstance(reply, dict) else None
        pending = self._pending.get(rid) if isinstance(rid, int) else None
        if pending is not None:
            _settle(pending, reply=reply)
        elif isinstance(rid, int) and rid in self._abandoned:
            self.late_replies += 1
            log.warning(
                "dropped a late reply from %s: request %d had been given up (%d so far)",
                self.endpoint,
                rid,
                self.late_replies,
            )
        else:
            self.unknown_replies += 1
            log.warning(
                "dropped a reply from %s naming no request of ours (id %.40r; %d so far)",
                self.endpoint,
                rid,
                self.unknown_replies,
            )


def _settle(
    pending: _Pending, *, reply: dict[str, Any] | None = None, error: PolicyError | None = None
) -> None:
    pending.reply, pending.error, pending.done = reply, error, True
    pending.wake.set()
