"""The live view: a real WebSocket client (the `websockets` package) connects to the
Foxglove server fed by the trace's writer thread and gets the channel advertisements and
the very records the trace writes."""

from __future__ import annotations

import asyncio
import json
import struct
import time

import pytest
import websockets
from trace_util import CONFIG, tick

from robotd.trace.live import LiveView
from robotd.trace.store import TraceStore

SUBPROTOCOL = "foxglove.sdk.v1"


async def _until(ws, want, deadline: float):
    """The next message from the server satisfying `want` (others skipped)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("no such message from the live view in time")
        try:
            msg = await asyncio.wait_for(ws.recv(), min(left, 0.05))
        except TimeoutError:
            yield None
            continue
        if want(msg):
            yield msg


def _advertised(msg) -> dict[str, dict]:
    if isinstance(msg, str):
        body = json.loads(msg)
        if body.get("op") == "advertise":
            return {c["topic"]: c for c in body["channels"]}
    return {}


async def _session(port: int, store: TraceStore) -> None:
    deadline = time.monotonic() + 20
    async with websockets.connect(f"ws://127.0.0.1:{port}", subprotocols=[SUBPROTOCOL]) as ws:
        channels: dict[str, dict] = {}
        async for msg in _until(ws, lambda m: isinstance(m, str), deadline):
            channels |= _advertised(msg) if msg is not None else {}
            if {"/robot/tick", "/events", "/policy/chunk", "/link"} <= set(channels):
                break
        tick_ch = channels["/robot/tick"]
        assert tick_ch["encoding"] == "json" and tick_ch["schemaEncoding"] == "jsonschema"
        assert json.loads(tick_ch["schema"])["title"] == "robotd.Tick"
        await ws.send(json.dumps({"op": "subscribe",
                                  "subscriptions": [{"id": 9, "channelId": tick_ch["id"]}]}))
        ep = store.begin_episode(1, "w1", None)
        s = 0
        # the subscription takes effect at some point: keep ticking until data arrives
        async for msg in _until(ws, lambda m: isinstance(m, bytes), deadline):
            if msg is None:
                s += 1
                ep.write("/robot/tick", 1_000_000 + s, tick(s))
                continue
            assert msg[0] == 0x01  # message data
            sub_id, log_time = struct.unpack_from("<IQ", msg, 1)
            record = json.loads(msg[13:])
            assert sub_id == 9 and record == tick(record["s"])
            assert log_time == 1_000_000 + record["s"]
            break
        ep.frame("top", 2_000_000, b"\xff\xd8\xff", 3)
        async for msg in _until(ws, lambda m: "/camera/top" in _advertised(m), deadline):
            if msg is not None:
                cam = _advertised(msg)["/camera/top"]
                assert cam["schemaName"] == "foxglove.CompressedImage"
                break
        ep.end("stopped")


@pytest.mark.timeout(60)
def test_websocket_client_sees_channels_and_messages(tmp_path):
    view = LiveView(port=0)
    store = TraceStore(tmp_path, 1 << 30, CONFIG, live=view)
    try:
        asyncio.run(_session(view.port, store))
    finally:
        store.close()  # closes the live view too
    with pytest.raises(OSError):  # refused: the server is gone
        asyncio.run(_connect(view.port))


async def _connect(port: int) -> None:
    async with websockets.connect(f"ws://127.0.0.1:{port}", subprotocols=[SUBPROTOCOL],
                                  open_timeout=5):
        pass


def test_port_is_checked():
    with pytest.raises(ValueError, match="port"):
        LiveView(port=70000)
