"""An act whose byte-stream connection the client drops (its reply broke the framing) fails
at once, not at its timeout: the wait would cost the episode's patience (real sockets; the
worker is a raw socket server that breaks the framing on purpose)."""

from __future__ import annotations

import contextlib
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


def _serve(server: socket.socket) -> None:
    """Answer hello, then answer the act with a prefix claiming a 1 GiB frame."""
    conn, _ = server.accept()
    with conn:
        hello = wire.unpackb(_read_message(conn)[0])
        reply = wire.packb({"id": hello["id"], "ok": True, "result": HELLO})
        conn.sendall(struct.pack("<IQ", 1, len(reply)) + reply)
        _read_message(conn)  # the act
        conn.sendall(struct.pack("<IQ", 1, 1 << 30))
        conn.settimeout(30)
        with contextlib.suppress(OSError):
            conn.recv(1)  # until the client hangs up


def test_an_act_on_a_dropped_connection_fails_at_once() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    threading.Thread(target=_serve, args=(server,), daemon=True).start()

    async def main() -> tuple[PolicyError, float]:
        client = PolicyClient(f"stream+tcp://127.0.0.1:{port}", timeout_s=15)
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
    assert error.code == "connection_lost" and "1073741824 bytes" in error.message, error
    assert took < 30, took  # its timeout is 60 s: it failed when the connection dropped
