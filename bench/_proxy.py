"""A slow link on loopback for the benches: a tcp proxy that delays each direction and
limits its bandwidth (one shaper per direction, shared by every connection through it)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from bench._common import BenchError


class _Shaper:
    """One direction of the link: bytes leave at `rate` bytes/s, arrive `delay` s later."""

    def __init__(self, delay_s: float, rate: float) -> None:
        self.delay_s, self.rate, self.free_at = delay_s, rate, 0.0

    def arrival(self, now: float, n: int) -> float:
        self.free_at = max(now, self.free_at) + n / self.rate
        return self.free_at + self.delay_s


class Proxy:
    """Forwards tcp ports to the worker's act and observe endpoints through two shapers."""

    def __init__(self, targets: list[tuple[str, int]], delay_s: float, mbit: float) -> None:
        self.targets = targets
        self.up = _Shaper(delay_s, mbit * 1e6 / 8)
        self.down = _Shaper(delay_s, mbit * 1e6 / 8)
        self.ports: list[int] = []
        self.servers: list[asyncio.Server] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise BenchError("the proxy did not start")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            for host, port in self.targets:
                server = await asyncio.start_server(
                    lambda r, w, h=host, p=port: self._connect(r, w, h, p), "127.0.0.1", 0
                )
                self.servers.append(server)
                self.ports.append(server.sockets[0].getsockname()[1])
            ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    async def _connect(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
    ) -> None:
        try:
            r2, w2 = await asyncio.open_connection(host, port)
            await asyncio.gather(
                self._pipe(reader, w2, self.up),
                self._pipe(r2, writer, self.down),
                return_exceptions=True,
            )
        except asyncio.CancelledError:
            # close() cancels every connection; ended here, not raised: asyncio's server
            # callback (3.11) logs a cancelled handler's CancelledError as an error
            writer.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, shaper: _Shaper
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                when, data = await queue.get()
                if not data:
                    writer.close()
                    return
                await asyncio.sleep(max(0.0, when - self.loop.time()))
                writer.write(data)
                await writer.drain()

        task = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(1 << 16):
                queue.put_nowait((shaper.arrival(self.loop.time(), len(data)), data))
        finally:
            queue.put_nowait((0.0, b""))
            await task

    def close(self) -> None:
        """Stops listening, cancels every connection's tasks (a loop stopped with them
        pending warns 'Task was destroyed but it is pending' when it is collected) and ends
        the loop and its thread."""

        async def shutdown() -> None:
            for server in self.servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        done = asyncio.run_coroutine_threadsafe(shutdown(), self.loop)
        with contextlib.suppress(Exception):  # a loop that cannot shut down still stops
            done.result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()
