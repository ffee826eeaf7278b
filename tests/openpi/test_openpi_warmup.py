"""The openpi link's warm-up inference (robotd.link.openpi.warmup), in the test's own event
loop: against the real openpi-server from PyPI (openpi_peer_server.py) whose first
inference is slow, as a JIT compile is (`first_delay`), and against hostile_server.py for
what a real server cannot be made to send (a junk reply, a traceback for the warm-up, a
late reply that comes while the link is idle). The request's shape is checked against a
real act's on every example config."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import tomllib
from typing import Any

import anyio
import numpy as np
import pytest
from hostile_server import Hostile, Peer, await_until
from peer_venv import REPO

from drivers.base import CameraSpec
from drivers.sim.camera import SimCamera
from drivers.sim.world import SimWorld
from robotd.config import config_from_dict
from robotd.link.openpi import codec, wire
from robotd.link.openpi.acts import OpenpiActs
from robotd.link.openpi.client import OpenpiLink
from robotd.link.openpi.errors import ActTimeout, ServerError
from robotd.link.openpi.options import OpenpiOptions
from robotd.link.openpi.request import build_request
from robotd.link.steps import LinkCounters, RingFrames, StepReader, StepRing
from robotd.link.windows import assemble

FIRST_DELAY_S = 3.0  # the server's first inference ("compiling"); acts time out at 1 s
FAST = {"backoff_initial_s": 0.05, "backoff_max_s": 0.5, "connect_timeout_s": 5}
WARM = {"prompt": "warm-up", "state": np.zeros(8, np.float32)}


def _link(url: str, warmup_s: float = 30.0, request: Any = WARM) -> OpenpiLink:
    link = OpenpiLink(url, OpenpiOptions(warmup_s=warmup_s, **FAST))
    link.warmup_request = request
    return link


async def _warmed(url: str, warmup_s: float = 30.0) -> OpenpiLink:
    """A link connected to `url` whose warm-up has run (however it ended)."""
    link = _link(url, warmup_s)
    await link.connect(deadline_s=30)
    await link.warm_up()
    return link


def _prompt(reply: dict[str, Any]) -> str:
    return {k[1]: v for k, v in reply["echo"]["items"]}["prompt"]["value"]


def _messages(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level and "warm-up" in r.msg]


def test_an_act_asked_during_the_warm_up_waits_and_gets_its_own_answer(
    openpi_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The warm-up holds acts: the act's own timeout (1 s, shorter than the server's first
    inference) starts once the warm-up answered; its answer is its own, not the warm-up's;
    status says the warm-up runs, then how long it took."""
    caplog.set_level(logging.INFO, "robotd.link.openpi")
    server = openpi_server(first_delay=FIRST_DELAY_S)

    async def main() -> None:
        link = _link(server.url)
        await link.connect(deadline_s=30)
        mine = np.full((4, 8), 7.0, np.float32)
        got: list[dict[str, Any]] = []

        async def act() -> None:
            got.append(await link.act({"prompt": "the act", "want_actions": mine}, 1.0))

        async with anyio.create_task_group() as tg:
            tg.start_soon(link.warm_up)
            await await_until(lambda: link.warmup.phase == "running", "the warm-up sent")
            tg.start_soon(act)
            await anyio.wait_all_tasks_blocked()  # the act waits behind the warm-up
            assert link.warmup.words().startswith("running for ")
            assert not got
        (reply,) = got
        assert _prompt(reply) == repr("the act") and np.array_equal(reply["actions"], mine)
        assert link.warmup.phase == "answered" and link.warmup.took_s >= FIRST_DELAY_S - 0.5
        assert link.warmup.words().startswith("answered in ")
        state = link.state
        assert state.acts == 1 and state.connects == 1 and state.unknown_replies == 0
        await link.close()

    anyio.run(main)
    said = _messages(caplog)
    assert any(m.startswith("openpi warm-up inference started") for m in said), said
    assert any(m.startswith("openpi warm-up inference answered in ") for m in said), said
    assert not _messages(caplog, logging.WARNING)


def test_without_a_warm_up_the_first_act_times_out(openpi_server: Any) -> None:
    """What the warm-up is for: the same server and act, no warm-up (warmup_s = 0)."""
    server = openpi_server(first_delay=FIRST_DELAY_S)

    async def main() -> None:
        link = _link(server.url, warmup_s=0)
        await link.connect(deadline_s=30)
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.warm_up)  # armed by nothing: returns at once
        with pytest.raises(ActTimeout, match="no reply within 1 s"):
            await link.act({"prompt": "the act"}, 1.0)
        assert link.warmup.phase == "off" and link.warmup.words() == ""
        await link.close()

    anyio.run(main)


def test_a_warm_up_that_times_out_warns_and_acts_are_served(
    openpi_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """No answer within warmup_s: a WARNING, and the act goes; the connection is kept and
    the warm-up's late reply, which the server sends first, is dropped, not taken for the
    act's."""
    caplog.set_level(logging.INFO, "robotd.link.openpi")
    server = openpi_server(first_delay=FIRST_DELAY_S)

    async def main() -> None:
        link = _link(server.url, warmup_s=0.5)
        await link.connect(deadline_s=30)
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.warm_up)
        assert link.warmup.phase == "timed_out"
        assert link.warmup.words() == "not answered within 0.5 s; acts served without it"
        mine = np.full((2, 8), 3.0, np.float32)
        reply = await link.act({"prompt": "after", "want_actions": mine}, 30.0)
        assert _prompt(reply) == repr("after") and np.array_equal(reply["actions"], mine)
        assert link.state.connects == 1 and link.state.unknown_replies == 0
        await link.close()

    anyio.run(main)
    warned = _messages(caplog, logging.WARNING)
    assert any("not answered within 0.5 s; acts are served now" in m for m in warned), warned
    assert any("answered late, after" in m for m in _messages(caplog)), _messages(caplog)


def test_a_late_reply_that_came_while_idle_is_dropped_before_the_next_act(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The warm-up's reply comes after warmup_s, while no act is in flight: it waits unread
    and is dropped as the warm-up's when the next act goes (not counted as a frame no
    request asked for, which would close the connection)."""
    caplog.set_level(logging.INFO, "robotd.link.openpi")
    release = threading.Event()  # set from the test; the server's loop is another thread
    late = codec.packb({"actions": np.full((1, 8), 9.0, np.float32)})

    async def script(peer: Peer) -> None:
        peer.send(codec.packb({"policy": "hostile"}))
        await peer.request()  # the warm-up: answered only when the test says
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        peer.send(late)
        while (req := await peer.request()) is not None:
            want = codec.unpackb(req)["want"]
            peer.send(codec.packb({"actions": np.full((1, 8), float(want), np.float32)}))

    with Hostile(script) as server:

        async def main() -> None:
            link = await _warmed(server.url, warmup_s=0.3)
            assert link.warmup.phase == "timed_out"
            release.set()
            conn = link._conn  # the frame is read off the socket, waiting unread
            assert conn is not None
            await await_until(lambda: wire.pending_frames(conn) == 1, "the late reply")
            reply = await link.act({"want": 5}, 10.0)
            assert reply["actions"][0, 0] == 5.0
            assert link.state.unknown_replies == 0 and link.state.connects == 1
            await link.close()

        anyio.run(main)
    assert any("answered late" in m for m in _messages(caplog)), _messages(caplog)


JUNK = [
    b"\xc1" * 5000,  # not msgpack
    codec.packb([1, 2, 3]),  # not a map
    codec.packb({b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [1 << 29, 8]}),
]


@pytest.mark.parametrize("junk", JUNK, ids=["not-msgpack", "not-a-map", "lying-array"])
def test_a_junk_warm_up_reply_is_logged_bounded_and_dropped(
    junk: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever the warm-up's reply holds, it is one bounded WARNING and dropped; the
    connection stays (one reply for one request) and the act after it is served."""
    caplog.set_level(logging.INFO, "robotd.link.openpi")

    async def script(peer: Peer) -> None:
        peer.send(codec.packb({"policy": "hostile"}))
        await peer.request()
        peer.send(junk)
        while await peer.request() is not None:
            peer.send(codec.packb({"actions": np.ones((1, 8), np.float32)}))

    with Hostile(script) as server:

        async def main() -> None:
            link = await _warmed(server.url)
            assert link.warmup.phase == "answered"
            reply = await link.act({"prompt": "x"}, 10.0)
            assert reply["actions"].shape == (1, 8) and link.state.connects == 1
            await link.close()

        anyio.run(main)
    (warned,) = _messages(caplog, logging.WARNING)
    assert "with no usable reply (dropped)" in warned and len(warned) < 600, warned


def test_a_warm_up_the_server_fails_is_not_repeated_until_an_act_is_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server fails the warm-up (openpi's traceback in a text frame, then close 1011):
    a WARNING with its last line, the connection gone. The next connect skips the warm-up
    (the same request would fail again, reconnect after reconnect, and no act would ever
    be served); once an act was answered, a connect warms up again."""
    caplog.set_level(logging.INFO, "robotd.link.openpi")
    tb = "Traceback (most recent call last):\n  ...\nValueError: " + "z" * 100_000

    async def script(peer: Peer) -> None:
        peer.send(codec.packb({"policy": "hostile"}))
        while (req := await peer.request()) is not None:
            if codec.unpackb(req).get("prompt") == WARM["prompt"] and server.connections == 1:
                peer.send(tb)
                return peer.close(1011, "Internal server error")
            peer.send(codec.packb({"actions": np.ones((1, 8), np.float32)}))

    with Hostile(script) as server:

        async def main() -> None:
            link = await _warmed(server.url)
            assert link.warmup.phase == "failed" and not link.connected
            await link.connect(deadline_s=30)
            await link.warm_up()
            assert link.warmup.phase == "skipped"
            assert (await link.act({"prompt": "x"}, 10.0))["actions"].shape == (1, 8)
            await link.connect(deadline_s=30)
            await link.warm_up()
            assert link.warmup.phase == "answered"
            await link.close()

        anyio.run(main)
    warned = _messages(caplog, logging.WARNING)
    assert len(warned) == 2, warned
    assert warned[0].startswith("openpi warm-up inference failed after") and len(warned[0]) < 600
    assert "ValueError: zzz" in warned[0]
    assert warned[1].startswith("openpi warm-up inference skipped")


def _shapes(value: Any) -> Any:
    """What the server compiles for: keys, array dtypes and shapes, other values' types."""
    if isinstance(value, dict):
        return {k: _shapes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shapes(v) for v in value]
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape)
    return type(value).__name__


def _stacked_droid(raw: dict[str, Any]) -> None:
    """DROID with a window of three steps, the exterior camera stacked, the wrist as JPEG."""
    streams = {"exterior": {"at": [-4, -2, 0]}, "wrist": {}, "joints.pos": {}}
    raw["policy"]["observations"] = {"streams": streams}
    raw["policy"]["openpi"]["inputs"][0]["window"] = "stack"
    raw["policy"]["openpi"]["inputs"][1]["image"]["codec"] = "jpeg"


@pytest.mark.parametrize(
    "name, change",
    [("droid", None), ("aloha", None), ("libero", None), ("droid", _stacked_droid)],
    ids=["droid", "aloha", "libero", "droid-stacked-jpeg"],
)
def test_the_warm_up_request_is_shaped_as_a_real_act(name: str, change: Any) -> None:
    """OpenpiActs.warmup_request against the request a real act builds from the example's
    sim robot and cameras: the same keys, dtypes and shapes; neutral contents (zeros,
    black frames, the task input's default prompt)."""
    raw = tomllib.loads((REPO / "config" / f"openpi-{name}.toml").read_text())
    if change is not None:
        change(raw)
    cfg = config_from_dict(raw)
    link = OpenpiLink(cfg.policy.worker, cfg.policy.openpi)  # never connected
    reader = StepReader(StepRing(16), RingFrames({}))
    acts = OpenpiActs(cfg, link, reader, lambda _m: None, task=lambda: "",
                      on_lost=lambda _r: None, counters=LinkCounters())  # fmt: skip
    warm = acts.warmup_request()
    world = SimWorld.local(len(cfg.joints.names), time.monotonic_ns())
    frames = {}
    for cam, spec in cfg.cameras.items():
        sim = SimCamera(CameraSpec(cam, spec.width, spec.height, spec.fps),
                        SimCamera.Options.model_validate(spec.options), world=world)  # fmt: skip
        sim.open()
        frames[cam] = sim.render_now(time.monotonic_ns())
        sim.close()
    joints = np.linspace(-0.5, 0.5, len(cfg.joints.names))

    def value(_step: int, key: str) -> Any:
        return frames.get(key, joints)

    real = build_request(cfg.policy.openpi, assemble(acts.planner.plan(60, 50), value), "a task")
    assert _shapes(warm) == _shapes(real)
    for key, got in warm.items():
        if isinstance(got, np.ndarray):
            assert not got.any(), key
    prompts = [i.default for i in cfg.policy.openpi.inputs if i.source == "task"]
    assert [warm[i.key] for i in cfg.policy.openpi.inputs if i.source == "task"] == prompts


def test_a_late_traceback_for_the_warm_up_skips_the_next_one() -> None:
    """The server fails the warm-up after warmup_s: the act that reads it fails with the
    connection (openpi closes it, 1011), and the next connect skips the warm-up, as when
    the server fails it in time."""
    release = threading.Event()

    async def script(peer: Peer) -> None:
        peer.send(codec.packb({"policy": "hostile"}))
        if server.connections == 1:
            await peer.request()  # the warm-up
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
            peer.send("Traceback (most recent call last):\nValueError: late")
            return peer.close(1011, "Internal server error")
        while await peer.request() is not None:
            peer.send(codec.packb({"actions": np.ones((1, 8), np.float32)}))

    with Hostile(script) as server:

        async def main() -> None:
            link = await _warmed(server.url, warmup_s=0.3)
            assert link.warmup.phase == "timed_out"
            release.set()
            with pytest.raises(ServerError, match="1011"):
                await link.act({"prompt": "x"}, 10.0)
            await link.connect(deadline_s=30)
            await link.warm_up()
            assert link.warmup.phase == "skipped"
            assert (await link.act({"prompt": "y"}, 10.0))["actions"].shape == (1, 8)
            await link.close()

        anyio.run(main)


def test_the_keepalive_waits_for_a_compile(openpi_server: Any) -> None:
    """openpi's server answers no ping while its first inference compiles: with pongs due
    within keepalive_s (0.5 s here) the connection would drop mid-compile; during the
    warm-up they may take as long as the warm-up may, and the keepalive is back after."""
    server = openpi_server(first_delay=FIRST_DELAY_S)

    async def main() -> None:
        link = OpenpiLink(server.url, OpenpiOptions(keepalive_s=0.5, warmup_s=30, **FAST))
        link.warmup_request = WARM
        await link.connect(deadline_s=30)
        await link.warm_up()
        assert link.warmup.phase == "answered" and link.connected
        assert link._conn is not None and link._conn.ping_timeout == 0.5
        assert (await link.act({"prompt": "after"}, 10.0))["actions"].shape == (10, 8)
        await link.close()

    anyio.run(main)
