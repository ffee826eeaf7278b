"""Review findings on the openpi link, each against a real socket: a hostile websocket
server written here (websockets), or a missing/garbage CA file for wss://."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from robotd.link.openpi import codec
from robotd.link.openpi.client import OpenpiLink
from robotd.link.openpi.errors import ConnectionLost
from robotd.link.openpi.options import OpenpiOptions
from robotd.operator.robotctl import ControlClient
from tests.copy_util import wait_for
from tests.daemon_util import REPO, Daemon

FAST = OpenpiOptions(backoff_initial_s=0.02, backoff_max_s=0.1, connect_timeout_s=5, healthz="")
DEADLINE_S = 30.0


@asynccontextmanager
async def duplicating_server(sent: anyio.Event) -> AsyncIterator[str]:
    """Answers each request with actions filled with its `n`, and sends every reply twice
    (`sent` is set once both copies of the first are written)."""

    async def handler(ws: ServerConnection) -> None:
        await ws.send(codec.packb({}))
        async for frame in ws:
            assert isinstance(frame, bytes)
            n = codec.unpackb(frame)["n"]
            reply = codec.packb({"actions": np.full((2, 2), n, np.float32)})
            await ws.send(reply)
            await ws.send(reply)
            sent.set()

    async with serve(handler, "127.0.0.1", 0, compression=None) as srv:
        yield f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}"


def _n(reply: dict[Any, Any]) -> int:
    return int(reply["actions"][0, 0])


def test_duplicated_reply_is_never_taken_for_the_next_answer() -> None:
    """Repro: a server (or proxy) sending a reply twice made the next act return the
    previous request's actions (stale rows played as fresh ones)."""

    async def main() -> None:
        sent = anyio.Event()
        async with duplicating_server(sent) as url:
            link = OpenpiLink(url, FAST)
            await link.connect(deadline_s=DEADLINE_S)
            with anyio.fail_after(DEADLINE_S):
                assert _n(await link.act({"n": 1}, timeout_s=DEADLINE_S)) == 1
                await sent.wait()
                conn = link._conn
                assert conn is not None
                await (await conn.ping())  # the pong follows the duplicate on the stream
            with pytest.raises(ConnectionLost, match="no request asked for"):
                await link.act({"n": 2}, timeout_s=DEADLINE_S)
            assert not link.state.connected
            assert "duplicated" in link.state.last_error
            await link.connect(deadline_s=DEADLINE_S)
            assert _n(await link.act({"n": 3}, timeout_s=DEADLINE_S)) == 3
            await link.close()

    anyio.run(main)


@pytest.mark.parametrize("content", [None, "not a certificate\n"])
def test_unusable_ca_file_is_a_named_error(tmp_path: Path, content: str | None) -> None:
    """Repro: `policy.openpi.ca_file` missing (or not PEM) with a wss:// worker made
    `robotd run` die with a FileNotFoundError traceback instead of a named error."""
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_text(content)
    opts = FAST.model_copy(update={"ca_file": str(ca)})
    with pytest.raises(ValueError, match=r"policy\.openpi\.ca_file '.*ca\.pem'"):
        OpenpiLink("wss://127.0.0.1:9", opts)
    OpenpiLink("ws://127.0.0.1:9", opts)  # no TLS: the CA file is not read


def test_a_repeated_server_traceback_is_logged_once(openpi_server: Any, tmp_path: Path) -> None:
    """Repro: a policy failing every act (a config mistake: a key the server lacks) had
    the daemon log the server's whole traceback again at each of its ~2 reconnects a
    second, forever. Now once in full, then one line a failure."""
    server = openpi_server(policy="test")
    d = Daemon(
        tmp_path,
        "--config",
        str(REPO / "config" / "openpi-droid.toml"),
        "--set",
        f'policy.worker="{server.url}"',
    )
    client = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        d.wait_line(r"episode_start")
        for cmd in ("stop", "reset_done"):
            client.request(cmd)
        assert client.request("start", {"task": "raise"})["ok"]  # the test policy raises
        wait_for(
            lambda: sum("(the same traceback)" in line for line in d.log) >= 2,
            "repeated failures",
            timeout=DEADLINE_S,
        )
        assert sum('raise RuntimeError("test policy failure")' in ln for ln in d.log) == 1
    finally:
        client.close()
        d.signal()
        assert d.wait_exit() == 0, "".join(d.log[-30:])


def test_a_flooding_server_cannot_fill_memory() -> None:
    """Repro: a server sending frames nobody asked for had websockets queue up to 16 of
    them unread (16 x max_reply_bytes, 1 GiB at the default) between two acts. Now it
    stops reading the socket past MAX_QUEUED_FRAMES and the next act drops the
    connection."""
    flood = codec.packb({"actions": np.zeros((1 << 15, 8), np.float32)})  # 1 MiB a frame

    async def handler(ws: ServerConnection) -> None:
        await ws.send(codec.packb({}))
        with contextlib.suppress(ConnectionClosed):
            for _ in range(64):
                await ws.send(flood)

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, compression=None) as srv:
            link = OpenpiLink(f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}", FAST)
            await link.connect(deadline_s=DEADLINE_S)
            conn = link._conn
            assert conn is not None
            with anyio.fail_after(DEADLINE_S):
                while not conn.recv_messages.paused:  # stopped reading: a bounded queue
                    await anyio.sleep(0.01)
            assert len(conn.recv_messages.frames) <= 4  # one socket read may add a frame
            with pytest.raises(ConnectionLost, match="no request asked for"):
                await link.act({"n": 1}, timeout_s=DEADLINE_S)
            await link.close()

    anyio.run(main)
