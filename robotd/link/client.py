"""The daemon's side of the act connection to a policy worker (docs/protocol.md).

`PolicyClient` is used from the main process's async lane (anyio on uvloop). Several
requests may be in flight: each carries an id and its reply is matched by id. The socket is
watched by the event loop itself (robotd.link.dealer): each reply is read as it arrives and
handed to the request it answers, whose caller is woken. Every call is bounded by a timeout,
so a dead worker cannot hang the caller: it raises TimeoutError. A worker's error reply
raises PolicyError with its code; a reply that breaks the protocol raises PolicyError with
code "bad_reply" naming the field.

With a worker that speaks protocol 2 (its hello says so), requests travel framed
(robotd.framed): the observations' arrays as frames of their own, sent from their memory.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio

from robotd import framed, wire
from robotd.contract.answers import MAX_ANSWER_BYTES
from robotd.link.dealer import DealerClosed, LoopDealer
from robotd.link.dropped import DroppedReplies
from robotd.link.replies import (
    PROTOCOL,
    ActReply,
    ActResult,
    Handshake,
    PolicyError,
    decode_act_reply,
    parse_act_result,
    parse_handshake,
    unwrap,
)
from robotd.link.stream_dealer import StreamDealer
from robotd.stream.endpoint import is_stream

log = logging.getLogger("robotd.link")

__all__ = ["ActResult", "Handshake", "PolicyClient", "PolicyError"]

# The most a reply can legitimately be: a header (framed's own bound on one) and one chunk of
# the most rows any robot takes (robotd.contract.answers). Far below what requests may be
# (camera frames, up to wire.MAX_MESSAGE_BYTES): a worker that sends more cannot make the
# daemon take in a GiB; its connection is closed (logged) as for a broken prefix.
MAX_REPLY_BYTES = framed.MAX_HEADER_BYTES + MAX_ANSWER_BYTES


@dataclass(slots=True)
class _Pending:
    wake: asyncio.Future[None]  # resolved when settled: the cheapest wake-up asyncio has
    cmd: str
    done: bool = False
    reply: dict[str, Any] | ActReply | None = None
    error: BaseException | None = None


class PolicyClient:
    """A connection to one worker's act endpoint: a ZeroMQ DEALER to its ROUTER (tcp://,
    ipc://), or a byte stream (stream+tcp://, stream+ipc://: robotd.link.stream_dealer).

    `timeout_s` bounds every call (overridable per act). `max_reply_bytes` bounds one reply
    (a byte stream: the whole message; ZeroMQ: each frame, ZMQ_MAXMSGSIZE); a larger one
    closes the connection, and the requests it held time out. Not thread-safe: use it from
    the event loop's thread. `close()` is idempotent.
    """

    def __init__(
        self, endpoint: str, *, timeout_s: float = 10.0, max_reply_bytes: int = MAX_REPLY_BYTES
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        # replies never handed to a request, counted by kind (robotd.link.dropped)
        self.dropped = DroppedReplies(endpoint)
        kind = StreamDealer if is_stream(endpoint) else LoopDealer
        self._dealer: LoopDealer | StreamDealer = kind(
            endpoint, self._dispatch, max_message_bytes=max_reply_bytes
        )
        if isinstance(self._dealer, StreamDealer):
            self._dealer.on_lost = self._connection_lost
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self.bytes_sent = 0  # request bytes sent, for the benchmarks
        self.protocol = 1  # what the worker's hello said: 2 sends large arrays as frames
        self.last_heard = time.monotonic()  # when the worker last sent anything (its liveness)

    def dropped_replies(self) -> dict[str, int]:
        """The replies dropped so far, by kind (robotd.link.dropped.DROPPED_KINDS)."""
        return dict(self.dropped.counts)

    @property
    def connect_error(self) -> str:
        """Why the connection is not up, when the transport knows ("connection refused"
        over a byte stream; ZeroMQ does not say): "" otherwise."""
        return getattr(self._dealer, "last_error", "")

    async def connect(self, *, observe: bool = False) -> Handshake:
        """Connect and say hello; returns the worker's contract and endpoints. `observe`:
        this client uploads observations, so ask for the observe endpoint (a worker tells
        only clients that ask)."""
        self._dealer.open()
        hello: dict[str, Any] = {"cmd": "hello", "protocol": PROTOCOL}
        if observe:
            hello["observe"] = True
        self.protocol = 1  # until this worker says what it speaks
        handshake = parse_handshake(await self._request(hello, self.timeout_s))
        self.protocol = handshake.protocol
        return handshake

    async def act(
        self,
        episode: str,
        step: int,
        steps: list[int],
        observations: list[dict[str, Any]],
        *,
        timeout_s: float | None = None,
        rtc: dict[str, Any] | None = None,
        task: str = "",
    ) -> ActResult:
        """Ask for a chunk computed from `step`; `steps`/`observations` are the window;
        `rtc` the frozen prefix (robotd.link.rtc), sent when given; `task` the episode's
        task text (the policy's Episode.task), sent when there is one."""
        message: dict[str, Any] = {
            "cmd": "act",
            "episode": episode,
            "step": step,
            "steps": list(steps),
            "observations": list(observations),
        }
        if rtc is not None:
            message["rtc"] = rtc
        if task:
            message["task"] = task
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
        task: str = "",
    ) -> ActResult:
        """Ask for a chunk computed from `step`, naming the window (`reads[i]`: the keys read
        at `steps[i]`) that the worker holds from uploads; `inline` carries uploads
        ({"step", "values", "frames"}) the worker lacks. `release_below`: no later act of
        the episode reads steps below it. `wait_s`: how long the worker waits for missing
        steps before answering PolicyError "missing_steps" (see PolicyError.missing).
        `rtc` and `task`: as for `act`."""
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
        if task:
            message["task"] = task
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
        self._dealer.close()

    async def _request(self, message: dict[str, Any], timeout_s: float) -> Any:
        """The result of `message`'s reply: a map, or for an act that succeeded its typed
        fields (ActFields, for parse_act_result)."""
        if not self._dealer.is_open:
            raise PolicyError("closed", "not connected (call connect() first)")
        loop = asyncio.get_running_loop()
        rid = next(self._ids)
        cmd = message["cmd"]
        pending = self._pending[rid] = _Pending(loop.create_future(), cmd)
        body = {"id": rid, **message}
        # Protocol 2: arrays as frames of their own, sent from their memory (no body copy).
        frames = framed.pack(body) if self.protocol >= 2 else [wire.packb(body)]
        self.bytes_sent += sum(memoryview(f).nbytes for f in frames)
        # The deadline is a timer, not a cancel scope: a scope costs more than the work.
        timer = loop.call_later(timeout_s, self._expire, rid, timeout_s)
        try:
            if not self._dealer.try_send(frames):  # no worker there (yet), or its queue full
                with anyio.fail_after(timeout_s):
                    await self._dealer.send(frames)
            if not pending.done:
                await pending.wake
        except DealerClosed:
            _settle(pending, error=PolicyError("closed", "the client was closed"))
        finally:
            timer.cancel()
            popped = self._pending.pop(rid, None)
            if pending.reply is not None:
                self.dropped.settled(rid, cmd, answered=True)
            elif popped is not None:  # given up here (cancelled, closed, connection lost)
                self.dropped.settled(rid, cmd, answered=False)
        if pending.error is not None:
            raise pending.error
        reply = pending.reply
        if type(reply) is ActReply:
            return reply.result
        assert reply is not None
        return unwrap(reply, cmd)

    def _connection_lost(self, why: str) -> None:
        """A byte stream dropped: every act sent on it fails now, not at its timeout (a
        broken reply would otherwise cost the whole wait, the episode's patience too), and
        so does a ping (the next goes on the new connection: whoever answers it says which
        worker process it is). The other requests keep theirs: hello's wait says why the
        link is down, in its words."""
        for pending in list(self._pending.values()):
            if not pending.done and pending.cmd in ("act", "ping"):
                error = PolicyError("connection_lost", f"the connection broke ({why})")
                _settle(pending, error=error)

    def _expire(self, rid: int, timeout_s: float) -> None:
        """Request `rid` got no reply in time: its caller raises TimeoutError."""
        pending = self._pending.pop(rid, None)
        if pending is not None and not pending.done:
            self.dropped.settled(rid, pending.cmd, answered=False)  # a reply may come late
            _settle(pending, error=TimeoutError(f"no reply within {timeout_s:g} s"))

    def _dispatch(self, frames: list[bytes]) -> None:
        """Hand one reply (one frame, or framed) to the request it answers; any other reply
        is dropped, counted by kind and logged (`_drop`). Only an answer to one of our
        requests (late ones too) is news of the worker (`last_heard`): junk a peer streams
        at us is not a heartbeat."""
        typed = decode_act_reply(frames)
        if typed is not None:
            pending = self._pending.get(typed.id)
            if pending is not None and pending.cmd == "act" and not pending.done:
                self.last_heard = time.monotonic()
                _settle(pending, reply=typed)
                return
        try:
            reply = framed.unpack(frames)
        except wire.WireError as err:
            self.dropped.undecodable(err)
            return
        named = reply.get("id") if isinstance(reply, dict) else None
        rid = named if type(named) is int else None  # a bool is no id (True is not 1)
        pending = self._pending.get(rid) if rid is not None else None
        if pending is not None and not pending.done:
            self.last_heard = time.monotonic()
            _settle(pending, reply=reply)
        else:
            waiting = pending.cmd if pending is not None else None
            answered = pending is not None and pending.reply is not None
            if self.dropped.drop(named, rid, waiting, answered):
                self.last_heard = time.monotonic()  # slow, but it is the worker answering us


def _settle(
    pending: _Pending,
    *,
    reply: dict[str, Any] | ActReply | None = None,
    error: BaseException | None = None,
) -> None:
    pending.reply, pending.error, pending.done = reply, error, True
    if not pending.wake.done():
        pending.wake.set_result(None)
