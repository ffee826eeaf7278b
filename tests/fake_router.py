"""A ZeroMQ ROUTER served from a thread, for tests that play the worker's side by hand."""

from __future__ import annotations

import threading
from typing import Any

import zmq

from robotd import framed, wire


class FakeRouter:
    """Binds `endpoint`; every request (one frame or framed) is unpacked and answered with
    `reply(msg)` (packed, one frame), then handed to `seen(msg)`. Subclasses say what to
    answer and what to record."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def reply(self, msg: dict[str, Any]) -> Any:
        raise NotImplementedError

    def seen(self, msg: dict[str, Any]) -> None:
        """Called after each reply was sent."""

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            route, *message = self.sock.recv_multipart()
            msg = framed.unpack(message)  # one frame, or framed (protocol 2)
            self.sock.send_multipart([route, wire.packb(self.reply(msg))])
            self.seen(msg)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
        self.ctx.term()
