"""The main process's end of the lane (robotd.runtime.bridge.LaneBridge.run) on real ipc
sockets: a frame that does not decode is counted and logged, a handler that raises is logged
with its message's kind, and neither stops what comes after; an e-stop's answer that
overtakes an older state still on the up stream is not undone by it."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
import zmq
import zmq.asyncio

from robotd.lane import codec
from robotd.lane.messages import Event, Fault, Ready, Reply, Status
from robotd.runtime.bridge import LaneBridge, lane_endpoint


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


def _said(state: str, seq: int) -> Status:
    fault = Fault("estop", "now", False) if state == "FAULT" else None
    return Status(state, 1, "w", 0, "", fault, 0, False, True, seq=seq)


def test_an_estop_answer_is_not_undone_by_an_older_state_read_after_it(tmp_path: Path) -> None:
    """The lane said IDLE on the up stream, then took an e-stop on lane.sock; the e-stop's
    answer (FAULT) is read first, the IDLE after: the status stays FAULT, and the lane's
    next word (newer) is taken."""

    async def main() -> list[str]:
        ctx = zmq.asyncio.Context()
        bridge = LaneBridge(ctx, tmp_path)
        bridge.bind()
        lane_sock = zmq.Context.instance().socket(zmq.ROUTER)
        lane_sock.bind(lane_endpoint(tmp_path))
        up = zmq.Context.instance().socket(zmq.PUSH)
        up.connect(bridge.up_ep)
        bridge.connect()
        seen: list[str] = []
        marks = [anyio.Event(), anyio.Event()]
        bridge.on(Ready, lambda msg: marks[msg.pid - 1].set())
        try:
            up.send(codec.encode_batch([_said("IDLE", 1)]))  # said first, read last

            async def lane() -> None:
                who, data = await anyio.to_thread.run_sync(lane_sock.recv_multipart)
                estop = codec.decode_estop(data)
                answer = Reply(estop.id, True, _said("FAULT", 2))
                lane_sock.send_multipart([who, codec.encode(answer)])

            async with anyio.create_task_group() as tg:
                tg.start_soon(lane)
                with anyio.fail_after(30):
                    reply = await bridge.estop("now")
                assert reply.ok and bridge.status is not None
                seen.append(bridge.status.state)
                tg.start_soon(bridge.run)
                up.send(codec.encode_batch([Ready(1, [])]))
                with anyio.fail_after(30):
                    await marks[0].wait()
                seen.append(bridge.status.state)
                up.send(codec.encode_batch([_said("IDLE", 3), Ready(2, [])]))
                with anyio.fail_after(30):
                    await marks[1].wait()
                seen.append(bridge.status.state)
                tg.cancel_scope.cancel()
        finally:
            up.close(linger=0)
            lane_sock.close(linger=0)
            bridge.close()
            ctx.term()
        return seen

    assert anyio.run(main) == ["FAULT", "FAULT", "IDLE"]


def test_an_estop_the_lane_never_acknowledges_times_out_in_words(tmp_path: Path) -> None:
    """A lane that reads lane.sock and never answers (stopped, hung): the e-stop's timeout
    says what did not happen, where it was a bare TimeoutError (logged as `timeout: `)."""

    async def main() -> str:
        ctx = zmq.asyncio.Context()
        bridge = LaneBridge(ctx, tmp_path)
        bridge.bind()
        lane = zmq.Context.instance().socket(zmq.ROUTER)
        lane.bind(bridge.estop_ep)
        bridge.connect()
        try:
            with pytest.raises(TimeoutError) as late:
                await bridge.estop("nobody answers", timeout_s=0.5)
            assert lane.poll(5000), "the e-stop never reached lane.sock"
            return str(late.value)
        finally:
            lane.close(linger=0)
            bridge.close()
            ctx.term()

    said = anyio.run(main)
    assert said.startswith("the control lane did not acknowledge the e-stop within 0.5 s"), said
