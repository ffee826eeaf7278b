"""A live view: the trace's channels served to the Foxglove app over its WebSocket protocol.

`LiveView` is a sink of the trace's writer thread, so it is fed the very bytes that go
into the MCAP files (no second encoding, nothing on the event loop). It binds to the
loopback by default: open Foxglove, "Open connection", ``ws://127.0.0.1:8765``. Every
channel of the table is advertised at start; cameras when their first frame comes.
"""

from __future__ import annotations

import logging
import threading

import foxglove

from robotd.trace.schemas import CHANNELS, ChannelSpec

log = logging.getLogger("robotd.trace")
DEFAULT_PORT = 8765


class LiveView:
    """A Foxglove WebSocket server on `host`:`port` (port 0: any free port, see `port`)."""

    def __init__(self, port: int = DEFAULT_PORT, host: str = "127.0.0.1", name: str = "robotd"):
        if not 0 <= port <= 65535:
            raise ValueError(f"live view: port must be in 0..65535, got {port}")
        self._ctx = foxglove.Context()
        self._lock = threading.Lock()  # channels are made by the writer thread and at start
        self._channels: dict[str, foxglove.Channel] = {}
        for spec in CHANNELS.values():
            self._channel(spec)
        self._server = foxglove.start_server(name=name, host=host, port=port, context=self._ctx)
        self._closed = False
        if host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("live view: serving the trace on %s:%d, beyond this computer", host,
                        self.port)
        log.info("live view: ws://%s:%d (Foxglove: Open connection)", host, self.port)

    @property
    def port(self) -> int:
        return int(self._server.port)

    def _channel(self, spec: ChannelSpec) -> foxglove.Channel:
        with self._lock:
            ch = self._channels.get(spec.topic)
            if ch is None:
                schema = foxglove.Schema(name=spec.schema_name, encoding="jsonschema",
                                         data=spec.schema_bytes)
                ch = foxglove.Channel(spec.topic, schema=schema, message_encoding="json",
                                      context=self._ctx)
                self._channels[spec.topic] = ch
            return ch

    def publish(self, spec: ChannelSpec, log_time_ns: int, data: bytes) -> None:
        """Send one encoded record to every subscribed client (dropped when none is)."""
        ch = self._channels.get(spec.topic) or self._channel(spec)
        ch.log(data, log_time=log_time_ns)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._server.stop()
