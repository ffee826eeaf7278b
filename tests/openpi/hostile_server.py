"""A websocket server that misbehaves on purpose, for the openpi link's hostile tests.

Real sockets on loopback, served by an asyncio loop on a thread of its own, so the daemon
(a subprocess) and a link in the test's own event loop can both be pointed at it. The
opening handshake is websockets' own (its Sans-I/O ServerProtocol, which also parses what
the client sends); after it, every byte the server writes is the test's choice: frames of
any opcode and any claimed length, half a frame, no pong for a ping, no answer at all.
`GET /healthz` answers 200 (as openpi's server does) unless the test hands its own.

    async def script(peer: Peer) -> None:       # one call per websocket connection
        peer.send(codec.packb({}))               # the metadata frame
        while (request := await peer.request()) is not None:
            peer.send(b"\\xc1")                   # a reply that is not msgpack
    with Hostile(script) as server:              # server.url: ws://127.0.0.1:PORT
        ...
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol

READ = 1 << 16
START_S = 30.0  # the loop thread up and listening, on a loaded machine


class Peer:
    """One accepted websocket connection, as the script sees it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.protocol = ServerProtocol(max_size=None)
        self.answer_pings = True
        self.pings = 0  # pings the client sent
        self._requests: asyncio.Queue[bytes | str | None] = asyncio.Queue()

    def send(self, data: bytes | str) -> None:
        """One whole frame: binary for bytes, text for str."""
        opcode = Opcode.TEXT if isinstance(data, str) else Opcode.BINARY
        payload = data.encode() if isinstance(data, str) else data
        self.send_raw(Frame(opcode, payload).serialize(mask=False))

    def send_raw(self, data: bytes) -> None:
        """Bytes as they are: half a frame, a header claiming any length."""
        if not self.writer.is_closing():
            self.writer.write(data)

    @staticmethod
    def header(length: int, opcode: int = Opcode.BINARY) -> bytes:
        """A final frame's header claiming `length` payload bytes (64-bit length form)."""
        return bytes([0x80 | opcode, 127]) + length.to_bytes(8, "big")

    def close(self, code: int = 1000, reason: str = "") -> None:
        """A close frame, then the connection closed (no wait for the client's answer)."""
        body = code.to_bytes(2, "big") + reason.encode()
        self.send_raw(Frame(Opcode.CLOSE, body).serialize(mask=False))
        self.writer.close()

    def abort(self) -> None:
        """The connection reset: no close frame."""
        self.writer.transport.abort()

    async def request(self) -> bytes | str | None:
        """The client's next data frame; None once it closed the connection."""
        return await self._requests.get()

    async def hang(self) -> None:
        """Answer nothing (pings included, unless answer_pings) until the client leaves."""
        while await self.request() is not None:
            pass

    async def _read(self) -> None:
        """Parse what the client sends; pongs and closes are answered only when asked."""
        try:
            while data := await self.reader.read(READ):
                self.protocol.receive_data(data)
                for event in self.protocol.events_received():
                    self._on_frame(event)
                self.protocol.data_to_send()  # websockets' own answers: never sent
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._requests.put_nowait(None)

    def _on_frame(self, frame: Frame) -> None:
        if frame.opcode is Opcode.PING:
            self.pings += 1
            if self.answer_pings:
                self.send_raw(Frame(Opcode.PONG, frame.data).serialize(mask=False))
        elif frame.opcode in (Opcode.BINARY, Opcode.TEXT):
            data = frame.data if frame.opcode is Opcode.BINARY else frame.data.decode()
            self._requests.put_nowait(bytes(data) if isinstance(data, bytes) else data)
        elif frame.opcode is Opcode.CLOSE:
            self._requests.put_nowait(None)


Script = Callable[[Peer], Awaitable[None]]
HealthScript = Callable[[asyncio.StreamWriter], Awaitable[None]]


class Hostile:
    """The server: `script` runs once for each websocket connection (its return closes
    the connection), `healthz` (optional) answers each GET /healthz in its place.
    `stop()` closes the listening socket and drops every connection; `start()` listens
    again on the same port. `mute`: connections accepted from now on are answered nothing
    at all (not the handshake, not /healthz) until the client leaves. Counts:
    `connections` (websocket handshakes answered), `open` (sockets not yet closed)."""

    def __init__(self, script: Script, healthz: HealthScript | None = None) -> None:
        self.script, self.healthz = script, healthz
        self.port = 0
        self.mute = False
        self.connections = 0
        self.open = 0
        self.peers: list[Peer] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def __enter__(self) -> Hostile:
        self._thread.start()
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_S)
        self._loop.close()

    def start(self) -> Hostile:
        self._call(self._listen())
        return self

    def stop(self) -> None:
        self._call(self._stop())

    def call(self, fn: Callable[[], Any]) -> Any:
        """`fn()` on the server's loop (where the peers live), its result returned."""

        async def run() -> Any:
            return fn()

        return self._call(run())

    def _call(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(START_S)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.open += 1
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.open -= 1
            self._tasks.discard(task)
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mute:
            while await reader.read(READ):
                pass
            return
        peer = Peer(reader, writer)
        request = await _opening(peer)
        if request is None:
            return
        if request.path == "/healthz":
            if self.healthz is not None:
                return await self.healthz(writer)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nOK\n")
            await writer.drain()
            return
        peer.protocol.send_response(peer.protocol.accept(request))
        for chunk in peer.protocol.data_to_send():
            writer.write(chunk)
        self.connections += 1
        self.peers.append(peer)
        reading = asyncio.create_task(peer._read())
        try:
            await self.script(peer)
            await writer.drain()
        finally:
            reading.cancel()


async def _opening(peer: Peer) -> Request | None:
    """The client's HTTP request, parsed by websockets (None if it left before one)."""
    while data := await peer.reader.read(READ):
        peer.protocol.receive_data(data)
        for event in peer.protocol.events_received():
            if isinstance(event, Request):
                return event
    return None


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll `predicate` until true (generous deadline: a loaded 2-core machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.01)  # polling a condition with a deadline, not synchronising
    raise AssertionError(f"{what}: not within {timeout} s")


async def await_until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """`wait_until` for async tests."""
    with anyio.move_on_after(timeout):
        while not (got := predicate()):
            await anyio.sleep(0.01)
        return got
    raise AssertionError(f"{what}: not within {timeout} s")
