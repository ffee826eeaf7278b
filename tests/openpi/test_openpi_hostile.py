"""OpenpiLink against servers written here, speaking openpi's protocol (metadata frame,
then one reply a request) but misbehaving in ways openpi's own server never does:
garbage frames, a close 1011 without a traceback, oversized frames, a /healthz that says
503. Mocks of a misbehaving peer: no real server misbehaves on demand."""

from __future__ import annotations

import http
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np
import pytest
from websockets.asyncio.server import ServerConnection, serve

from robotd.link.openpi import codec
from robotd.link.openpi.client import OpenpiLink, json_safe
from robotd.link.openpi.errors import (
    ActTimeout,
    BadReply,
    CodecError,
    ConnectionLost,
    ServerError,
)
from robotd.link.openpi.options import OpenpiOptions

FAST = OpenpiOptions(backoff_initial_s=0.02, backoff_max_s=0.1, connect_timeout_s=2)
GOOD = codec.packb({"actions": np.zeros((2, 2), np.float32)})
Handler = Callable[[ServerConnection], Awaitable[None]]


@asynccontextmanager
async def server(handler: Handler, process_request: Any = None) -> AsyncIterator[str]:
    async with serve(
        handler, "127.0.0.1", 0, compression=None, max_size=None, process_request=process_request
    ) as srv:
        yield f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}"


def replying(*replies: Any, metadata: Any = b"\x80") -> Handler:
    """Send `metadata`, then answer the n-th request (counted over every connection) with
    replies[n] (bytes/str are sent, a callable is awaited with the connection), then GOOD."""
    count = [0]

    async def handler(ws: ServerConnection) -> None:
        await ws.send(metadata)
        async for _ in ws:
            n = count[0]
            reply = replies[n] if n < len(replies) else GOOD
            count[0] += 1
            if callable(reply):
                await reply(ws)
            else:
                await ws.send(reply)

    return handler


@pytest.mark.parametrize(
    "metadata, error",
    [
        ("Traceback: cannot load checkpoint", "server error instead of its metadata"),
        (b"\xc1", "metadata frame: not a valid msgpack"),
        (codec.packb([1, 2]), "metadata frame: not a map but list"),
    ],
)
def test_bad_metadata_is_retried_then_reported(metadata: Any, error: str) -> None:
    async def main() -> None:
        async with server(replying(metadata=metadata)) as url:
            link = OpenpiLink(url, FAST)
            with pytest.raises(ConnectionLost, match=r"no connection within 0\.5 s"):
                await link.connect(deadline_s=0.5)
            assert error in link.state.last_error and not link.state.connected

    anyio.run(main)


def test_undecodable_replies_keep_the_connection() -> None:
    async def main() -> None:
        async with server(replying(b"\xc1\xc1", codec.packb([1]), codec.packb(3))) as url:
            link = OpenpiLink(url, FAST)
            assert await link.connect(deadline_s=5) == {}
            with pytest.raises(BadReply, match="not a valid msgpack"):
                await link.act({"x": 1}, 5)
            with pytest.raises(BadReply, match="not a map but list"):
                await link.act({"x": 1}, 5)
            with pytest.raises(BadReply, match="not a map but int"):
                await link.act({"x": 1}, 5)
            assert link.state.connected
            assert (await link.act({"x": 1}, 5))["actions"].shape == (2, 2)
            await link.close()

    anyio.run(main)


async def _close(code: int, reason: str) -> Callable[[ServerConnection], Awaitable[None]]:
    async def do(ws: ServerConnection) -> None:
        await ws.close(code, reason)

    return do


@pytest.mark.parametrize(
    "code, reason, error, match",
    [
        (1011, "policy crashed", ServerError, "1011 .*policy crashed"),
        (1000, "bye", ConnectionLost, "closed during an act .code 1000 'bye'"),
        (1001, "", ConnectionLost, "code 1001"),
    ],
)
def test_closes(code: int, reason: str, error: type, match: str) -> None:
    async def main() -> None:
        async with server(replying(await _close(code, reason))) as url:
            link = OpenpiLink(url, FAST)
            await link.connect(deadline_s=5)
            with pytest.raises(error, match=match) as err:
                await link.act({"x": 1}, 5)
            if error is ServerError:
                assert err.value.code == 1011 and err.value.text == reason
            assert not link.state.connected
            await link.connect(deadline_s=5)  # and back
            assert (await link.act({"x": 1}, 5))["actions"].shape == (2, 2)
            await link.close()

    anyio.run(main)


def test_oversized_reply_is_refused() -> None:
    opts = FAST.model_copy(update={"max_reply_bytes": 1024})

    async def main() -> None:
        async with server(replying(codec.packb({"actions": np.zeros(1000)}))) as url:
            link = OpenpiLink(url, opts)
            await link.connect(deadline_s=5)
            with pytest.raises(ConnectionLost, match="closed by robotd: code 1009"):
                await link.act({"x": 1}, 5)
            await link.close()

    anyio.run(main)


def test_unencodable_request_sends_nothing() -> None:
    async def main() -> None:
        async with server(replying()) as url:
            link = OpenpiLink(url, FAST)
            await link.connect(deadline_s=5)
            with pytest.raises(CodecError, match=r"at images\.cam: cannot encode an array"):
                await link.act({"images": {"cam": np.array([object()])}}, 5)
            assert link.state.connected and link.state.acts == 0
            assert (await link.act({"x": 1}, 5))["actions"].shape == (2, 2)
            with pytest.raises(ValueError, match="timeout_s"):
                await link.act({"x": 1}, 0)
            await link.close()

    anyio.run(main)


def test_healthz_503_holds_off_the_handshake() -> None:
    """A serving engine answers 503 while no replica is ready: no handshake until 200."""
    ready = anyio.Event()
    polls: list[int] = []
    handshakes: list[int] = []

    def process_request(conn: ServerConnection, request: Any) -> Any:
        if request.path == "/healthz":
            polls.append(1)
            if not ready.is_set():
                return conn.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "warming up\n")
            return conn.respond(http.HTTPStatus.OK, "OK\n")
        handshakes.append(1)
        return None

    async def main() -> None:
        async with server(replying(metadata=codec.packb({"m": 1})), process_request) as url:
            link = OpenpiLink(url, FAST)
            async with anyio.create_task_group() as tg:
                tg.start_soon(link.connect)
                with anyio.fail_after(30):
                    while len(polls) < 3:
                        await anyio.sleep(0.01)
                assert not handshakes and not link.state.connected
                assert "answered 503 warming up" in link.state.last_error
                ready.set()
            assert link.state.connected and link.metadata == {"m": 1} and handshakes
            await link.close()

    anyio.run(main)


def test_server_without_healthz_is_still_reached() -> None:
    """A plain websocket server answers GET /healthz with 426: worth a handshake."""

    async def main() -> None:
        async with server(replying()) as url:
            link = OpenpiLink(url, FAST)
            assert await link.connect(deadline_s=5) == {}
            await link.close()

    anyio.run(main)


def test_random_frames_raise_only_typed_errors() -> None:
    rng = random.Random(11)
    valid = bytearray(GOOD)

    def frame() -> Any:
        kind = rng.random()
        if kind < 0.05:
            return "Traceback (most recent call last):\n  boom"
        if kind < 0.5:
            return bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        mutated = bytearray(valid)
        for _ in range(rng.randrange(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        return bytes(mutated)

    async def handler(ws: ServerConnection) -> None:
        await ws.send(b"\x80")
        async for _ in ws:
            await ws.send(frame())

    async def main() -> None:
        async with server(handler) as url:
            link = OpenpiLink(url, FAST)
            await link.connect(deadline_s=5)
            outcomes: dict[str, int] = {}
            for _ in range(300):
                try:
                    reply = await link.act({"x": 1}, 5)
                    assert isinstance(reply, dict)
                    outcome = "ok"
                except (BadReply, ServerError, ConnectionLost, ActTimeout) as exc:
                    outcome = type(exc).__name__
                if not link.state.connected:
                    await link.connect(deadline_s=5)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
            assert outcomes.get("BadReply", 0) > 50 and outcomes.get("ServerError", 0) > 0
            await link.close()

    anyio.run(main)


def test_metadata_for_status_is_json_safe() -> None:
    md = {
        b"raw": np.zeros((3, 4), np.float32),
        "n": np.int64(3),
        "deep": [[[[[["too deep"]]]]]],
        "s": "x" * 500,
        "b": b"\x00" * 9,
        "many": list(range(100)),
    }
    safe = json_safe(md)
    json.dumps(safe)
    assert safe["raw"] == "<array float32 [3, 4]>" and safe["n"] == 3 and safe["b"] == "<9 bytes>"
    assert len(safe["s"]) == 200 and len(safe["many"]) == 32


def test_close_stops_a_retrying_connect() -> None:
    """Nothing listens: connect() retries until close(), then ends with ConnectionLost."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections to it are refused

    async def main() -> None:
        link = OpenpiLink(f"ws://127.0.0.1:{port}", FAST)
        errors: list[BaseException] = []

        async def connect() -> None:
            try:
                await link.connect()
            except ConnectionLost as exc:
                errors.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(connect)
                while "refused" not in link.state.last_error:
                    await anyio.sleep(0.01)
                await link.close()
        assert errors and "closed" in str(errors[0])
        assert not link.state.connected and link.state.connects == 0

    anyio.run(main)
