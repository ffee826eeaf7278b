"""The daemon's client for an openpi policy server (websocket, openpi's msgpack format).

Used from the main process's event loop (anyio on asyncio/uvloop):

    link = OpenpiLink("ws://gpu-box:8000", options)   # ValueError for a bad endpoint/key env
    link.warmup_request = request                     # optional: warm up after each connect
    metadata = await link.connect()                   # retries until connected (or deadline)
    tg.start_soon(link.warm_up)                       # after each connect (acts wait for it)
    reply = await link.act(request, timeout_s=10)     # one request in flight
    link.state                                        # LinkState: connected, since, error
    await link.close()

The protocol (openpi's WebsocketPolicyServer): after the handshake the server sends one
binary frame, its metadata; then each binary request frame gets one binary reply frame.
A failing policy makes the server send its traceback as a text frame and close with 1011.

Contract:
- `connect()` drops any connection the link holds, then tries until one is made: poll
  `GET <healthz>` (skipped when options.healthz is ""), handshake (compression off, the
  `Authorization: Api-Key` header when a key is configured), read the metadata frame, all
  within `connect_timeout_s` per attempt; between attempts it sleeps a capped exponential
  backoff with jitter. With `deadline_s` it gives up after that long: ConnectionLost with
  the last error. Each success is a new server-side session: reset the episode.
- `act()` sends the request and reads one reply within `timeout_s`, raising exactly one of
  ActTimeout (the connection is then closed, so a late reply is never read), ServerError
  (text frame or close 1011, with the server's text; connection gone), ConnectionLost (no
  connection or it closed; connection gone) or BadReply (an undecodable reply or not a map;
  connection kept). CodecError before anything is sent for a request that cannot be
  encoded. Cancelling an act closes the connection too. Never hangs, never raises anything
  else because of what the server sent.
- A frame that answers no request (it came while none was in flight: a reply sent twice,
  an extra frame) closes the connection before the next request is sent, so that it is
  never taken for that request's answer; each is counted in `unknown_replies` (the act
  client's count of replies naming no request: `dropped_replies()`).
- The warm-up (robotd.link.openpi.warmup says why): with `warmup_request` set and
  options.warmup_s > 0, each connect holds acts (they wait before their own timeout
  starts) until `warm_up()` sent that request and its reply came (discarded), or warmup_s
  passed, or it failed. One that times out keeps the connection: its reply is owed, and
  dropped when it comes (read before the next act's own reply: the server answers in
  order). It never raises; what became of it is logged and in `warmup.words()`.
"""

from __future__ import annotations

import logging
import os
import random
import ssl
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import anyio
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.protocol import State

from robotd.link.openpi import codec, wire
from robotd.link.openpi.errors import (
    ActTimeout,
    BadReply,
    CodecError,
    ConnectionLost,
    ServerError,
)
from robotd.link.openpi.health import Endpoint, not_ready, tls_context
from robotd.link.openpi.options import OpenpiOptions
from robotd.link.openpi.shown import LinkState, json_safe
from robotd.link.openpi.warmup import Warmup

log = logging.getLogger("robotd.link.openpi")

CLOSE_TIMEOUT_S = 2.0  # a graceful close waits this long for the server's close frame
# Frames websockets queues unread before it stops reading the socket (its default, 16,
# lets a server that floods frames between acts park 16 x max_reply_bytes in memory).
MAX_QUEUED_FRAMES = 2


class OpenpiLink:
    """One connection at a time to one openpi server; see the module contract."""

    def __init__(self, endpoint: str, options: OpenpiOptions | None = None) -> None:
        self.options = options or OpenpiOptions()
        self.endpoint = Endpoint.parse(endpoint)
        key = self.options.api_key_value(os.environ)  # ValueError now, not at the first act
        self._headers = {"Authorization": f"Api-Key {key}"} if key else {}
        self._ssl: ssl.SSLContext | None = (
            tls_context(self.options.ca_file) if self.endpoint.secure else None
        )
        self._encoder = codec.Encoder()
        self._lock = anyio.Lock()  # one act in flight
        self._connecting = anyio.Lock()  # one connect at a time
        self._conn: ClientConnection | None = None
        self._closed = False
        self._rng = random.Random()
        self.metadata: dict[Any, Any] | None = None
        self._state = LinkState(endpoint, reconnecting_since=time.time())
        # the warm-up: its request, its gate and state, the replies owed on this connection
        self.warmup_request: Mapping[str, Any] | None = None
        self.warmup = Warmup(self.options.warmup_s, self.options.max_reply_bytes)
        self._warm_gate: anyio.Event | None = None
        self._owed = 0

    @property
    def state(self) -> LinkState:
        if not self._lock.locked():
            self._reap()
        return self._state

    @property
    def connected(self) -> bool:
        """Whether the connection is up. One that closed while no act was in flight (the
        server went away, or its pongs stopped coming) is dropped here with its reason: a
        link left idle must not say connected to a server long gone."""
        if not self._lock.locked():  # an act in flight reports its own connection's end
            self._reap()
        return self._conn is not None

    def dropped_replies(self) -> dict[str, int]:
        """The replies dropped so far, by kind, as robotd.link.dropped.DROPPED_KINDS counts
        them: here only frames that answered no request ("unknown")."""
        return {"unknown": self._state.unknown_replies}

    async def connect(self, *, deadline_s: float | None = None) -> dict[Any, Any]:
        """Connect (see the module contract) and return the server's metadata."""
        async with self._connecting:
            return await self._connect(deadline_s)

    async def _connect(self, deadline_s: float | None) -> dict[Any, Any]:
        self._require_open()
        self._drop(None)
        start = time.monotonic()
        delay = self.options.backoff_initial_s
        while True:
            self._require_open()
            try:
                return await self._attempt()
            except (OSError, TimeoutError, WebSocketException, ServerError, BadReply) as exc:
                self._failed(wire.describe(exc))
            left = None if deadline_s is None else deadline_s - (time.monotonic() - start)
            if left is not None and left <= 0:
                raise ConnectionLost(
                    f"{self.endpoint.url}: no connection within {deadline_s:g} s: "
                    f"{self._state.last_error}"
                )
            pause = delay * (0.75 + 0.25 * self._rng.random())
            await anyio.sleep(pause if left is None else min(pause, left))
            delay = min(delay * 2, self.options.backoff_max_s)

    async def _attempt(self) -> dict[Any, Any]:
        opts = self.options
        with anyio.fail_after(opts.connect_timeout_s):
            if opts.healthz:
                why = await not_ready(
                    self.endpoint, opts.healthz, self._headers, self._ssl, opts.connect_timeout_s
                )
                if why is not None:
                    raise ConnectionLost(why)
            conn = await self._open()
            try:
                metadata = await self._metadata(conn)
            except BaseException:
                wire.abort(conn)
                raise
        if self._closed:  # close() was called meanwhile
            wire.abort(conn)
            self._require_open()
        self._conn, self.metadata = conn, metadata
        if self.warmup_request is not None:  # before any act can be sent on it
            self._warm_gate = self.warmup.arm(self._state.acts)
        self._state = replace(
            self._state,
            connected=True,
            reconnecting_since=None,
            connects=self._state.connects + 1,
            metadata=json_safe(metadata),
        )
        shown = str(self._state.metadata)  # json_safe: bounded, unlike the server's own
        log.info("openpi server %s connected (metadata: %.200s)", self.endpoint.url, shown)
        return metadata

    async def _open(self) -> ClientConnection:
        kwargs: dict[str, Any] = {"ssl": self._ssl} if self._ssl is not None else {}
        return await ws_connect(
            self.endpoint.url,
            compression=None,
            max_size=self.options.max_reply_bytes,
            max_queue=MAX_QUEUED_FRAMES,
            additional_headers=self._headers,
            user_agent_header="robotd",
            proxy=None,
            open_timeout=None,  # bounded by connect_timeout_s around the whole attempt
            close_timeout=CLOSE_TIMEOUT_S,
            ping_interval=self.options.keepalive_s or None,
            ping_timeout=self.options.keepalive_s or None,
            **kwargs,
        )

    async def _metadata(self, conn: ClientConnection) -> dict[Any, Any]:
        try:
            frame = await conn.recv()
        except ConnectionClosed as exc:
            raise wire.closed_error(exc, "before sending its metadata") from None
        if isinstance(frame, str):
            raise wire.server_text(frame, "instead of its metadata")
        try:
            metadata = codec.unpackb(frame, max_bytes=self.options.max_reply_bytes)
        except CodecError as exc:
            raise BadReply(f"metadata frame: {exc}") from None
        if not isinstance(metadata, dict):
            raise BadReply(f"metadata frame: not a map but {type(metadata).__name__}")
        return metadata

    async def act(self, request: Mapping[str, Any], timeout_s: float) -> dict[Any, Any]:
        """One request, one reply (see the module contract)."""
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        payload = self._encoder.encode(request)  # CodecError: nothing sent
        await self.warmup.wait()  # before the act's own timeout: it is not the act's time
        with anyio.move_on_after(timeout_s) as scope:
            async with self._lock:
                conn = self._require_conn()
                await self._settle_owed(conn)
                self._require_in_step(conn)
                frame = await self._exchange(conn, payload)
        if scope.cancelled_caught:
            reason = f"no reply within {timeout_s:g} s; connection closed"
            self._failed(reason)
            raise ActTimeout(f"{self.endpoint.url}: {reason}")
        if isinstance(frame, str):
            err = wire.server_text(frame, "instead of a reply")
            self._drop(err.message)
            raise err
        try:
            reply = codec.unpackb(frame, max_bytes=self.options.max_reply_bytes)
        except CodecError as exc:
            raise self._bad(f"reply: {exc}") from None
        if not isinstance(reply, dict):
            raise self._bad(f"reply: not a map but {type(reply).__name__}")
        self._state = replace(self._state, acts=self._state.acts + 1)
        return reply

    def _require_in_step(self, conn: ClientConnection) -> None:
        """Refuse to send while a frame nobody asked for waits (a duplicated or extra
        reply): the next reply read would answer an older request. The connection is
        dropped, so replies and requests pair up again on the next one."""
        if self._count_unasked(conn):
            reason = (
                "the server sent a frame no request asked for (a duplicated or extra "
                "reply); connection closed"
            )
            self._failed(reason)
            raise ConnectionLost(f"{self.endpoint.url}: {reason}")

    async def _exchange(self, conn: ClientConnection, payload: bytes) -> str | bytes:
        try:
            await conn.send(payload)
            while self._owed:  # a timed-out warm-up's reply comes first: dropped
                self._late_warmup(await conn.recv())
            return await conn.recv()
        except ConnectionClosed as exc:
            err = wire.closed_error(exc, "during an act")
            self._drop(err.message)
            raise err from None
        except BaseException:  # timed out or cancelled mid-act: never read a late reply
            self._drop("act cancelled")
            raise

    async def warm_up(self) -> None:
        """The warm-up the last connect armed, if any (the module contract); never raises.
        Run it in a task of its own right after each connect: acts wait for it."""
        gate, request = self._warm_gate, self.warmup_request
        if gate is None or request is None or not self.warmup.current(gate):
            return
        self._warm_gate = None  # once a connect
        await self.warmup.run(gate, request, self._owing_exchange, lambda: self._state.acts)

    async def _owing_exchange(
        self, request: Mapping[str, Any], timeout_s: float
    ) -> str | bytes | None:
        """One request outside the acts (not counted, no warm-up waited for): its reply
        frame, or None when none came within `timeout_s` (the connection kept, the reply
        owed). CodecError (nothing sent); ServerError or ConnectionLost (connection
        dropped); a text frame is returned, the connection dropped (openpi closes it)."""
        payload = self._encoder.encode(request)
        frame: str | bytes | None = None
        with anyio.move_on_after(timeout_s):
            async with self._lock:
                conn = self._require_conn()
                self._require_in_step(conn)
                # openpi's server answers no ping while it compiles: a pong may take as
                # long as the warm-up may (websockets reads ping_timeout at each ping)
                keep = conn.ping_timeout
                conn.ping_timeout = keep and max(keep, timeout_s)
                try:
                    frame = await self._warm_reply(conn, payload)
                finally:
                    conn.ping_timeout = keep
        if isinstance(frame, str):
            self._drop(wire.server_text(frame, "instead of the warm-up's reply").message)
        return frame

    async def _warm_reply(self, conn: ClientConnection, payload: bytes) -> str | bytes:
        """Send, then read the reply. Cancelled (timed out) while reading, the reply is owed
        and the connection kept (websockets loses nothing to a cancelled recv); cancelled
        while sending (half a frame may have gone out) or failing, the connection dropped."""
        sent = False
        try:
            await conn.send(payload)
            sent = True
            return await conn.recv()
        except ConnectionClosed as exc:
            err = wire.closed_error(exc, "during the warm-up")
            self._drop(err.message)
            raise err from None
        except BaseException as exc:
            if sent and isinstance(exc, anyio.get_cancelled_exc_class()):
                self._owed += 1
            else:
                self._drop("warm-up cancelled")
            raise

    async def _settle_owed(self, conn: ClientConnection) -> None:
        """The owed warm-up replies that came meanwhile, read and dropped (they wait unread:
        recv returns at once)."""
        while self._owed and wire.pending_frames(conn):
            self._late_warmup(await conn.recv())

    def _late_warmup(self, frame: str | bytes) -> None:
        self._owed -= 1
        self.warmup.late(frame, self._state.acts)

    async def close(self) -> None:
        """Close the connection (gracefully, bounded) and refuse further use. Idempotent."""
        self._closed = self.warmup.closing = True
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.move_on_after(CLOSE_TIMEOUT_S + 0.5):
                await conn.close()
            wire.abort(conn)
        self._state = replace(self._state, connected=False)

    def _require_open(self) -> None:
        if self._closed:
            raise ConnectionLost(f"{self.endpoint.url}: the link is closed")

    def _require_conn(self) -> ClientConnection:
        self._require_open()
        self._reap()
        if self._conn is None:
            raise ConnectionLost(
                f"{self.endpoint.url}: not connected ({self._state.last_error or 'never was'})"
            )
        return self._conn

    def _reap(self) -> None:
        """Drop the connection if it has closed (websockets keeps reading between acts, so
        a server's close, a reset or a keepalive timeout ends it while the link is idle)."""
        conn = self._conn
        if conn is None or conn.state is not State.CLOSED:
            return
        self._count_unasked(conn)  # sent while idle, before the close: answering nothing
        self._failed(wire.closed_error(conn.protocol.close_exc, "while idle").message)

    def _count_unasked(self, conn: ClientConnection) -> int:
        """Frames received while no request was in flight (unread between acts), counted in
        `unknown_replies`; how many. Called only while no act is reading `conn`."""
        unasked = max(0, wire.pending_frames(conn) - self._owed)  # owed: a warm-up's
        if unasked:
            was = self._state
            self._state = replace(was, unknown_replies=was.unknown_replies + unasked)
        return unasked

    def _bad(self, message: str) -> BadReply:
        self._state = replace(self._state, last_error=message)
        return BadReply(f"{self.endpoint.url}: {message}")

    def _failed(self, reason: str) -> None:
        """Record a failure; the connection (if any) is dropped. Logged when it differs
        from the last one (a long outage is one line, not one a retry)."""
        repeated = reason == self._state.last_error
        self._drop(reason)
        (log.debug if repeated else log.warning)("openpi server %s: %s", self.endpoint.url, reason)

    def _drop(self, reason: str | None) -> None:
        """Abort the connection, if any; `reason` becomes the last error (None: kept)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            wire.abort(conn)
        self._owed = 0  # the warm-up's reply, if it was owed one, can no longer come
        self.warmup.release()
        was = self._state
        self._state = replace(
            was,
            connected=False,
            reconnecting_since=was.reconnecting_since or time.time(),
            last_error=was.last_error if reason is None else reason,
        )
