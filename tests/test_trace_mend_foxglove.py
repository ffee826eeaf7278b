"""What docs/trace.md says of `robotd run --foxglove`'s handshake: the Foxglove SDK's
server accepts the `foxglove.sdk.v1` subprotocol (and `foxglove.sdk.v1.1`) and answers a
client offering only the older `foxglove.websocket.v1` with HTTP 400. Should an SDK update
start accepting the old name, this fails and the docs' list of viewers needs redoing."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from robotd.trace.live import LiveView


async def _hello(port: int, protocols: list[str]) -> tuple[str | None, dict]:
    async with websockets.connect(f"ws://127.0.0.1:{port}", subprotocols=protocols,
                                  open_timeout=10) as ws:
        return ws.subprotocol, json.loads(await asyncio.wait_for(ws.recv(), 10))


@pytest.fixture
def view():
    v = LiveView(port=0)
    try:
        yield v
    finally:
        v.close()


@pytest.mark.parametrize("offered", [["foxglove.sdk.v1"], ["foxglove.sdk.v1.1"],
                                     ["foxglove.websocket.v1", "foxglove.sdk.v1"]])
def test_a_client_offering_the_sdk_subprotocol_connects(view, offered):
    chosen, hello = asyncio.run(_hello(view.port, offered))
    assert chosen in offered and chosen.startswith("foxglove.sdk.v1")
    assert hello["op"] == "serverInfo" and hello["name"] == "robotd"


def test_a_client_offering_only_the_old_subprotocol_gets_http_400(view):
    with pytest.raises(websockets.exceptions.InvalidStatus) as exc:
        asyncio.run(_hello(view.port, ["foxglove.websocket.v1"]))
    assert exc.value.response.status_code == 400
