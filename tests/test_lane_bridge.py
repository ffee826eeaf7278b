"""The main process's end of the lane (robotd.runtime.bridge.LaneBridge.run) on real ipc
sockets: a frame that does not decode is counted and logged, a handler that raises is logged
with its message's kind, and neither stops what comes after."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
import zmq
import zmq.asyncio

from robotd.lane import codec
from robotd.lane.messages import Event, Ready
from robotd.runtime.bridge import LaneBridge


def test_bad_frames_and_failing_handlers_are_logged_and_the_bridge_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        bridge = LaneBridge(ctx, tmp_path)
        bridge.bind()
        done = anyio.Event()

        def on_event(msg: Event) -> None:
            seen.append(msg.name)
            if msg.name == "boom":
                raise RuntimeError("a handler's bug")

        bridge.on(Event, on_event)
        bridge.on(Ready, lambda msg: done.set())
        lane = zmq.Context.instance().socket(zmq.PUSH)
        lane.connect(bridge.up_ep)
        try:
            lane.send(b"\xc1 not msgpack")  # never valid msgpack
            lane.send(codec.encode_batch([Event("boom", 1), Event("after", 2)]))
            lane.send(codec.encode(Event("x" * 65, 3)))  # over the name's bound: refused
            lane.send(codec.encode_batch([Event("last", 4), Ready(1, [])]))
            async with anyio.create_task_group() as tg:
                tg.start_soon(bridge.run)
                with anyio.fail_after(30):
                    await done.wait()
                tg.cancel_scope.cancel()
        finally:
            lane.close(linger=0)
            bridge.close()
            ctx.term()
        assert bridge.bad == 2

    with caplog.at_level(logging.ERROR, logger="robotd"):
        anyio.run(main)
    assert seen == ["boom", "after", "last"]  # the batch's next message still handled
    text = caplog.text
    assert text.count("bad message from the control lane") == 2
    assert "handling Event from the control lane" in text and "a handler's bug" in text
