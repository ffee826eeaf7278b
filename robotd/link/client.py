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
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import zmq
import zmq.asyncio

from robotd import wire
from robotd.contract import Actions, ContractError, Observations

log = logging.getLogger("robotd.link")

PROTOCOL = 1
MAX_MISSING = 1 << 16  # (step, key) pairs a missing_steps reply may name


class PolicyError(Exception):
    """The worker refused a request (`code` from its reply) or broke the protocol
    (`code` "bad_reply"). `detail` holds the error's other fields (e.g. `missing`)."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = detail or {}

    def missing(
        self, window: Mapping[int, Collection[str]] | None = None
    ) -> list[tuple[int, str, str]]:
        """For code "missing_steps": the (step, key, reason) triples the worker named.
        `window`: recorded step -> keys the act reads; a pair outside it is refused.
        PolicyError "bad_reply" naming the entry if the list is malformed."""
        given = self.detail.get("missing", [])
        if not isinstance(given, list) or len(given) > MAX_MISSING:
            raise _bad("act", f"field 'error.missing': not a list of at most {MAX_MISSING}")
        out = []
        for item in given:
            ok = (
                isinstance(item, list)
                and len(item) == 3
                and type(item[0]) is int
                and item[0] >= 0
                and isinstance(item[1], str)
                and isinstance(item[2], str)
            )
            if not ok:
                raise _bad("act", f"field 'error.missing': bad entry {item!r:.100}")
            if window is not None and item[1] not in window.get(item[0], ()):
                raise _bad(
                    "act",
                    f"field 'error.missing': step {item[0]} key {item[1][:64]!r} is not in "
                    "the act's window",
                )
            out.append((item[0], item[1], item[2][:500]))
        return out


@dataclass(slots=True)
class Handshake:
    """What the worker said at connect."""

    observations: Observations | None
    actions: Actions | None
    endpoints: dict[str, str | None]
    policy: str
    limits: dict[str, int] | None = None  # the worker's frame store limits, if it says


@dataclass(slots=True)
class ActResult:
    """A chunk: row i of `actions` (float64, H x D) is meant for step `step + i`."""

    actions: np.ndarray
    step: int
    episode: str
    infer_ms: float
    rtt_ms: float
    queue_ms: float = 0.0


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
        self.last_request_bytes = 0

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
        return _handshake(result)

    async def act(
        self,
        episode: str,
        step: int,
        steps: list[int],
        observations: list[dict[str, Any]],
        *,
        timeout_s: float | None = None,
    ) -> ActResult:
        """Ask for a chunk computed from `step`; `steps`/`observations` are the window."""
        started = time.perf_counter()
        result = await self._request(
            {
                "cmd": "act",
                "episode": episode,
                "step": step,
                "steps": list(steps),
                "observations": list(observations),
            },
            self.timeout_s if timeout_s is None else timeout_s,
        )
        rtt_ms = (time.perf_counter() - started) * 1e3
        return _act_result(result, episode, step, rtt_ms)

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
    ) -> ActResult:
        """Ask for a chunk computed from `step`, naming the window (`reads[i]`: the keys read
        at `steps[i]`) that the worker holds from uploads; `inline` carries uploads
        ({"step", "values", "frames"}) the worker lacks. `release_below`: no later act of
        the episode reads steps below it. `wait_s`: how long the worker waits for missing
        steps before answering PolicyError "missing_steps" (see PolicyError.missing)."""
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
        started = time.perf_counter()
        result = await self._request(message, self.timeout_s if timeout_s is None else timeout_s)
        rtt_ms = (time.perf_counter() - started) * 1e3
        return _act_result(result, episode, step, rtt_ms)

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
        self.last_request_bytes = len(data)
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
            self._pending.pop(rid, None)
        if pending.error is not None:
            raise pending.error
        assert pending.reply is not None
        return _unwrap(pending.reply, message["cmd"])

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
        if pending is None:  # a late reply to a request that timed out, or garbage
            level = logging.WARNING if rid is None else logging.DEBUG
            log.log(level, "dropped a reply with no waiting request (id %r): %.200r", rid, reply)
            return
        _settle(pending, reply=reply)


def _settle(
    pending: _Pending, *, reply: dict[str, Any] | None = None, error: PolicyError | None = None
) -> None:
    pending.reply, pending.error, pending.done = reply, error, True
    pending.wake.set()


def _bad(cmd: str, what: str) -> PolicyError:
    return PolicyError("bad_reply", f"reply to {cmd}: {what}")


def _unwrap(reply: dict[str, Any], cmd: str) -> dict[str, Any]:
    """The result of a well-formed reply; PolicyError for an error or malformed reply."""
    ok = reply.get("ok")
    if ok is True:
        result = reply.get("result")
        if not isinstance(result, dict):
            raise _bad(cmd, f"field 'result': not a map ({type(result).__name__})")
        return result
    if ok is not False:
        raise _bad(cmd, f"field 'ok': not a boolean ({ok!r})")
    error = reply.get("error")
    if not isinstance(error, dict):
        raise _bad(cmd, f"field 'error': not a map ({type(error).__name__})")
    code, message = error.get("code"), error.get("message")
    if not isinstance(code, str) or not isinstance(message, str):
        raise _bad(cmd, f"field 'error': code and message must be strings ({error!r:.200})")
    detail = {k: v for k, v in error.items() if k not in ("code", "message")}
    raise PolicyError(code, message, detail)


def _handshake(result: dict[str, Any]) -> Handshake:
    if result.get("protocol") != PROTOCOL:
        raise _bad(
            "hello", f"field 'protocol': {result.get('protocol')!r}, this client speaks {PROTOCOL}"
        )
    contract = result.get("contract")
    if not isinstance(contract, dict):
        raise _bad("hello", f"field 'contract': not a map ({type(contract).__name__})")
    try:
        obs = contract.get("observations")
        observations = None if obs is None else Observations.from_wire(obs, "contract.observations")
        act = contract.get("actions")
        actions = None if act is None else Actions.from_wire(act, "contract.actions")
    except ContractError as err:
        raise _bad("hello", str(err)) from None
    endpoints = result.get("endpoints")
    if not isinstance(endpoints, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in endpoints.items()
    ):
        raise _bad("hello", "field 'endpoints': not a map of name -> endpoint string or None")
    policy = result.get("policy")
    if not isinstance(policy, str):
        raise _bad("hello", f"field 'policy': not a string ({policy!r:.100})")
    limits = result.get("limits")
    if limits is not None and not (
        isinstance(limits, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in limits.values())
    ):
        raise _bad("hello", f"field 'limits': not a map of name -> integer > 0 ({limits!r:.100})")
    return Handshake(observations, actions, dict(endpoints), policy, limits)


def observe_address(observe: str, act_endpoint: str) -> str:
    """The observe endpoint to connect to: a tcp wildcard host (0.0.0.0, *, ::) that the
    worker bound is replaced by the host the act endpoint named."""
    prefix = "tcp://"
    if not (observe.startswith(prefix) and act_endpoint.startswith(prefix)):
        return observe
    host, _, port = observe[len(prefix) :].rpartition(":")
    if host not in ("0.0.0.0", "*", "[::]", "::"):
        return observe
    act_host = act_endpoint[len(prefix) :].rpartition(":")[0]
    return f"{prefix}{act_host}:{port}"


def _act_result(result: dict[str, Any], episode: str, step: int, rtt_ms: float) -> ActResult:
    rows = result.get("actions")
    if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.dtype.kind not in "biuf":
        shape = rows.shape if isinstance(rows, np.ndarray) else type(rows).__name__
        raise _bad("act", f"field 'actions': not a 2-D numeric array ({shape})")
    if rows.shape[0] < 1 or rows.shape[1] < 1:
        raise _bad("act", f"field 'actions': empty chunk of shape {rows.shape}")
    rows = rows.astype(np.float64)  # a writable copy of the read-only wire array
    if not np.isfinite(rows).all():
        raise _bad("act", "field 'actions': holds NaN or infinity")
    if result.get("step") != step or isinstance(result.get("step"), bool):
        raise _bad("act", f"field 'step': {result.get('step')!r}, asked for {step}")
    if result.get("episode") != episode:
        raise _bad("act", f"field 'episode': {result.get('episode')!r:.100}, asked for {episode!r}")
    timing = result.get("timing")
    if not isinstance(timing, dict):
        raise _bad("act", f"field 'timing': not a map ({type(timing).__name__})")
    times = {}
    for name in ("infer_ms", "queue_ms"):
        value = timing.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise _bad("act", f"field 'timing.{name}': not a number >= 0 ({value!r})")
        times[name] = float(value)
    return ActResult(rows, step, episode, times["infer_ms"], rtt_ms, times["queue_ms"])
