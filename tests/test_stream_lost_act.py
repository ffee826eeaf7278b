"""An act whose byte-stream connection the client drops (its reply broke the framing) fails
at once, not at its timeout: the wait would cost the episode's patience (real sockets; the
worker is a raw socket server that breaks the framing on purpose, or closes). The broken
framing is a misbehaving worker, logged as a warning; a plain close is logged as info."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time

import anyio
import pytest

from robotd import wire
from robotd.link.client import PolicyClient
from robotd.link.replies import PolicyError

HELLO = {"protocol": 1, "contract": {}, "endpoints": {}, "policy": "p:W"}


def _read_message(conn: socket.socket) -> list[bytes]:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    (count,) = struct.unpack("<I", exactly(4))
    lengths = struct.unpack(f"<{count}Q", exactly(8 * count))
    return [exactly(n) for n in lengths]


def _serve(server: socket.socket, close: bool) -> None:
    """Answer hello, then answer the act with a prefix claiming a 1 GiB frame (`close`:
    close the connection instead)."""
    conn, _ = server.accept()
    with conn:
        hello = wire.unpackb(_read_message(conn)[0])
        reply = wire.packb({"id": hello["id"], "ok": True, "result": HELLO})
        conn.sendall(struct.pack("<IQ", 1, len(reply)) + reply)
        _read_message(conn)  # the act
        if close:
            return
        conn.sendall(struct.pack("<IQ", 1, 1 << 30))
        conn.settimeout(30)
        with contextlib.suppress(OSError):
            conn.recv(1)  # until the client hangs up


def _act_on(close: bool) -> tuple[PolicyError, float, str]:
    """The act's error, how long it took to fail, and the endpoint."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    endpoint = f"stream+tcp://127.0.0.1:{server.getsockname()[1]}"
    threading.Thread(target=_serve, args=(server, close), daemon=True).start()

    async def main() -> tuple[PolicyError, float]:
        client = PolicyClient(endpoint, timeout_s=15)
        try:
            await client.connect()
            started = time.monotonic()
            with pytest.raises(PolicyError) as lost:
                await client.act("W", 0, [0], [{}], timeout_s=60)
            return lost.value, time.monotonic() - started
        finally:
            await client.close()

    try:
        error, took = anyio.run(main)
    finally:
        server.close()
    return error, took, endpoint


def _said(caplog: pytest.LogCaptureFixture, endpoint: str) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.getMessage().startswith(f"act connection to {endpoint}: ")
    ]


def test_an_act_on_a_dropped_connection_fails_at_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="robotd.link"):
        error, took, endpoint = _act_on(close=False)
    assert error.code == "connection_lost" and "1073741824 bytes" in error.message, error
    assert took < 30, took  # its timeout is 60 s: it failed when the connection dropped
    assert _said(caplog, endpoint) == [
        (
            logging.WARNING,
            f"act connection to {endpoint}: the stream broke: a message of 1073741824 bytes, "
            "over 18874368; reconnecting",
        )
    ]


def test_a_plain_close_by_the_worker_is_logged_as_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="robotd.link"):
        error, took, endpoint = _act_on(close=True)
    assert error.code == "connection_lost" and "the peer closed the stream" in error.message
    assert took < 30, took
    said = _said(caplog, endpoint)
    assert said, caplog.text
    assert all(level == logging.INFO for level, _ in said), said
    assert "the peer closed the stream" in said[0][1]
