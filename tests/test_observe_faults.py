"""Faults on the observe stream (issue 3's audit): limits smaller than a window, malformed
acknowledgements and act replies, refused uploads, acts that never reach the policy. Real
sockets, real shared-memory rings and, where the worker's part matters, a real worker."""

from __future__ import annotations

import importlib
import logging
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from robotd.config import load_config
from robotd.contract import Actions, Observations, Stream
from robotd.link.act import ActLink
from robotd.link.client import Handshake, PolicyClient
from robotd.link.connect import make_uplink, warn_window_over_limit
from robotd.link.replies import PROTOCOL
from robotd.link.steps import TIMING_SAMPLE, LinkCounters, RingFrames, StepReader, StepRing
from robotd.link.uplink import Uplink, UplinkLimits
from robotd.link.windows import WindowPlanner
from tests.client_util import dropped_after
from tests.fake_router import FakeRouter
from tests.serve_util import serving
from tests.test_uplink import (
    KEYS,
    Robot,
    ask,
    feed,
    make_act_link,
    merged,
    observed,
    planner,
    reader,
    refuse_step,
    robot,
    run,
    settle,
    sockdir,
)
from tests.test_uplink import make_uplink as uplink  # connect's make_uplink is used too

__all__ = ["robot", "sockdir"]  # fixtures used here


# ---------------------------------------------------------------- a window over the limit


def test_an_act_whose_window_is_over_the_limit_gets_its_frames_at_once(
    sockdir: Path, robot: Robot
) -> None:
    """when_behind=wait, a 3-frame window, a 2-frame limit: the act's last step must not
    wait for room that only the act itself can make."""
    plan = planner(cam=Stream(at=[-6, -3, 0]))
    fake, up = observed(
        sockdir, plan, robot, timing="sync", open_loop_horizon=6, limits=UplinkLimits(2, 1 << 30)
    )

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            up.on_step(robot.step("W", 0))
            up.on_ask("W", 0, 0)
            up.ensure("W", plan.needed(0, None))
            await fake.wait_for(1)
            up.settled("W", 0, True)
            up.on_chunk(merged({"wep": "W", "from": 0, "at": 0, "rows": 6}))  # next ask at 6
            await feed(up, robot, range(1, 7))
            await fake.wait_for(2)  # steps 0 and 3 are held: step 6 waits for room
            up.on_ask("W", 6, 0)
            up.ensure("W", plan.needed(6, 0))
            await fake.wait_until(lambda: (6, "cam") in fake.posts(), timeout=3.0)
            tg.cancel_scope.cancel()

    try:
        run(main)
        assert fake.posts() == [(0, "cam"), (3, "cam"), (6, "cam")]
        assert up.mispredicted == 0 and up.counters.skipped_frames == 0
    finally:
        fake.close()


def test_connect_warns_when_one_window_cannot_fit_the_frame_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = load_config(overrides=["policy.max_episode_frames=4"])
    obs = Observations(streams={c: Stream(at=[-6, -3, 0]) for c in cfg.cameras})
    plan = WindowPlanner(obs.resolve(cfg.control.hz), cfg.observation_keys)
    hello = Handshake(obs, Actions(open_loop_horizon=4), {"observe": "ipc:///x-o"}, "p:P")
    caplog.set_level(logging.WARNING, "robotd.link")
    steps = StepRing(keep=64)
    up = make_uplink(
        cfg,
        hello,
        "ipc:///x",
        obs,
        plan,
        hello.actions,
        StepReader(steps, RingFrames({})),
        LinkCounters(),
    )
    assert up is not None and up.conn.limits.episode_frames == 4
    assert "reads 6 camera frames" in caplog.text
    assert "only 4 frames per episode (policy.max_episode_frames = 4)" in caplog.text
    assert "at least 12" in caplog.text
    caplog.clear()
    assert not warn_window_over_limit(plan, set(cfg.cameras), 4, UplinkLimits(6), 6)
    assert caplog.text == ""


def test_a_step_without_a_camera_frame_is_declared_skipped_saying_so(
    sockdir: Path, robot: Robot
) -> None:
    plan = planner(cam=Stream(at=[-1, 0]))
    fake, up = observed(sockdir, plan, robot)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            robot.step("W", 0).cams["cam"] = None  # no frame had arrived at step 0
            robot.step("W", 1)
            up.on_ask("W", 1, 0)
            up.ensure("W", plan.needed(1, None))
            await fake.wait_for(2)
            tg.cancel_scope.cancel()

    try:
        run(main)
        assert fake.skips() == [(0, ["cam"], "the camera had no frame at that step")]
        assert fake.posts() == [(1, "cam")]
    finally:
        fake.close()


# ---------------------------------------------------------------- malformed acknowledgements


class RawObserve(FakeRouter):
    """An observe socket whose acknowledgements are whatever `answer(msg)` returns (packed
    as they are), one per upload."""

    def __init__(self, endpoint: str, answer: Callable[[dict[str, Any]], Any]) -> None:
        super().__init__(endpoint)
        self.answer = answer
        self.got: list[dict[str, Any]] = []
        self.start()

    def reply(self, msg: dict[str, Any]) -> Any:
        return self.answer(msg)

    def seen(self, msg: dict[str, Any]) -> None:
        self.got.append(msg)


def ack(msg: dict[str, Any], **result: Any) -> dict[str, Any]:
    body = {"episode": msg["episode"], "step": msg["step"], "through": msg["step"]}
    return {"id": msg["id"], "ok": True, "result": {**body, "refused": None, **result}}


BAD_ACKS: list[tuple[Callable[[dict[str, Any]], Any], str]] = [
    (lambda m: {"id": m["id"], "ok": True, "result": "garbage"}, "field 'result'"),
    (lambda m: {"id": m["id"], "ok": True, "result": [1, 2]}, "field 'result'"),
    (lambda m: {"id": m["id"], "ok": "yes", "result": {}}, "field 'ok'"),
    (lambda m: {"id": m["id"], "ok": False, "error": "no"}, "field 'error'"),
    (lambda m: ack(m, through="far"), "field 'result.through'"),
    (lambda m: ack(m, through=True), "field 'result.through'"),
    (lambda m: ack(m, refused=5), "field 'result.refused'"),
    (lambda m: ack(m, refused={"code": 1, "message": "x"}), "field 'result.refused'"),
    (lambda m: ack(m, step="zero"), "field 'result.step'"),
    (lambda m: ack(m, episode=["W"]), "field 'result.episode'"),
    (lambda m: [m["id"]], "unexpected reply"),
    (lambda m: {"id": "x"}, "unexpected reply"),
]


@pytest.mark.parametrize(("bad", "needle"), BAD_ACKS)
def test_a_malformed_acknowledgement_is_warned_and_dropped(
    sockdir: Path,
    robot: Robot,
    caplog: pytest.LogCaptureFixture,
    bad: Callable[[dict[str, Any]], Any],
    needle: str,
) -> None:
    def answer(msg: dict[str, Any]) -> Any:
        return bad(msg) if msg["step"] == 0 else ack(msg)

    plan = planner(cam=Stream(every=1))
    fake = RawObserve(f"ipc://{sockdir}/o.sock", answer)
    up = uplink(f"ipc://{sockdir}/o.sock", plan, robot)
    caplog.set_level(logging.WARNING, "robotd.link")

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            up.on_step(robot.step("W", 0))
            await settle()
            up.on_step(robot.step("W", 1))
            with anyio.fail_after(5):  # the uploads go on after the bad answer
                while up.conn.through("W") != 1:
                    await anyio.sleep(0.005)
            tg.cancel_scope.cancel()

    try:
        run(main)
    finally:
        fake.close()
    assert needle in caplog.text
    assert up.counters.uploaded_frames == 2 and up.counters.refused_frames == 0
    assert up.counters.unknown_acks == (needle == "unexpected reply")


# ---------------------------------------------------------------- act replies and failures


class FakeWorker(FakeRouter):
    """An act socket answering hello with no contract, and every act with `answer(msg)`
    (the reply's ok and error or result)."""

    def __init__(self, endpoint: str, answer: Callable[[dict[str, Any]], dict[str, Any]]):
        super().__init__(endpoint)
        self.answer = answer
        self.acts: list[dict[str, Any]] = []
        self.start()

    def reply(self, msg: dict[str, Any]) -> Any:
        if msg["cmd"] == "hello":
            hello = {
                "protocol": PROTOCOL,
                "contract": {"observations": None, "actions": None},
                "endpoints": {"observe": None},
                "policy": "fake:Worker",
            }
            return {"id": msg["id"], "ok": True, "result": hello}
        self.acts.append(msg)
        return {"id": msg["id"], **self.answer(msg)}


def missing(*pairs: tuple[int, str]) -> dict[str, Any]:
    error = {"code": "missing_steps", "message": "missing", "missing": []}
    error["missing"] = [[s, k, "not arrived"] for s, k in pairs]
    return {"ok": False, "error": error}


def act_once(
    endpoint: str, plan: WindowPlanner, rob: Robot, up: Uplink, ask_id: int
) -> list[dict[str, Any]]:
    """Steps 0..3 of episode W made, then one act asked at step 3 (ask `ask_id`) over a
    fresh client to the worker at `endpoint`, which must be listening, with no contract
    (the worker's hello says none); returns the chunk messages the link sent the lane."""
    chunks: list[dict[str, Any]] = []

    async def main() -> None:
        client = PolicyClient(endpoint, timeout_s=5)
        link = make_act_link(client, plan, rob, up, chunks, actions=None, stream_wait_s=0.1)
        await client.connect()
        for s in range(4):
            rob.step("W", s)
        await ask(link, ask_id, "W", 3)
        await client.close()

    run(main)
    return chunks


@pytest.mark.parametrize(
    ("pairs", "needle"),
    [
        ([(3, "bogus")], "step 3 key 'bogus' is not in the act's window"),
        ([(2, "cam")], "step 2 key 'cam' is not in the act's window"),
    ],
)
def test_missing_steps_outside_the_window_fail_the_act_not_the_daemon(
    sockdir: Path, robot: Robot, pairs: list[tuple[int, str]], needle: str
) -> None:
    plan = planner(cam=Stream(at=[-2, 0]))
    worker = FakeWorker(f"ipc://{sockdir}/w.sock", lambda m: missing(*pairs))
    up = uplink(f"ipc://{sockdir}/o.sock", plan, robot)
    try:
        chunks = act_once(f"ipc://{sockdir}/w.sock", plan, robot, up, 7)
    finally:
        worker.close()
    assert [c["k"] for c in chunks] == ["act_failed"]
    assert "bad_reply" in chunks[0]["reason"] and needle in chunks[0]["reason"]
    assert len(worker.acts) == 1  # never asked again with a made-up window


class BrokenUplink(Uplink):
    async def inline(self, wep: str, wanted: list[tuple[int, str]]) -> list[dict[str, Any]]:
        raise RuntimeError("a bug in the uplink")


def test_any_exception_in_an_act_becomes_act_failed_with_its_traceback(
    sockdir: Path, robot: Robot, caplog: pytest.LogCaptureFixture
) -> None:
    plan = planner(cam=Stream(at=[-2, 0]))
    worker = FakeWorker(f"ipc://{sockdir}/w.sock", lambda m: missing((3, "cam")))
    up = BrokenUplink(
        f"ipc://{sockdir}/o.sock",
        plan,
        reader(robot),
        {"cam": None},
        LinkCounters(),
    )
    caplog.set_level(logging.WARNING, "robotd.link")
    try:
        chunks = act_once(f"ipc://{sockdir}/w.sock", plan, robot, up, 8)
    finally:
        worker.close()
    assert [c["k"] for c in chunks] == ["act_failed"]
    assert "RuntimeError: a bug in the uplink" in chunks[0]["reason"]
    assert "Traceback" in caplog.text and "a bug in the uplink" in caplog.text


# ---------------------------------------------------------------- refused uploads


def test_refused_keys_can_go_up_again(sockdir: Path, robot: Robot) -> None:
    answer = refuse_step(1, "episode_frames", "the episode would hold too much", times=1)
    plan = planner(cam=Stream(every=1))
    fake, up = observed(sockdir, plan, robot, answer)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            await feed(up, robot, range(3))
            await fake.wait_for(3)
            with anyio.fail_after(5):
                while up.counters.refused_frames != 1:
                    await anyio.sleep(0.005)
            up.on_ask("W", 2, 0)
            up.ensure("W", plan.needed(2, None))  # reads 0, 1, 2: 1 goes up again
            await fake.wait_for(4)
            tg.cancel_scope.cancel()

    try:
        run(main)
        assert fake.posts() == [(0, "cam"), (1, "cam"), (2, "cam"), (1, "cam")]
    finally:
        fake.close()


# ---------------------------------------------------------------- acts that fail

POLICY = textwrap.dedent("""
    import numpy as np
    from robotd.contract import Actions, Camera, Observations, Stream

    SEEN = []

    class EveryTwo:
        observations = Observations(streams={"cam": Stream(at=[0], camera=Camera(codec="png")),
                                             "joints.pos": Stream(every=2)})
        actions = Actions(open_loop_horizon=4)

        def infer(self, inputs):
            SEEN.append(inputs)
            return np.zeros((4, 2))
""")


async def linked(
    endpoint: str, robot: Robot, chunks: list[dict[str, Any]], stream_wait_s: float, **kwargs: Any
) -> tuple[PolicyClient, Uplink, ActLink]:
    """A client connected, with observe, to the worker at `endpoint`; an uplink (not running
    yet; `kwargs` as Uplink takes them) to the observe endpoint it names; and an act link
    over both, its windows planned from the worker's contract at 30 Hz. The caller closes
    the client."""
    client = PolicyClient(endpoint, timeout_s=10)
    hello = await client.connect(observe=True)
    plan = WindowPlanner(hello.observations.resolve(30.0), KEYS)
    up = uplink(hello.endpoints["observe"], plan, robot, **kwargs)
    link = make_act_link(
        client, plan, robot, up, chunks, actions=hello.actions, stream_wait_s=stream_wait_s
    )
    return client, up, link


@pytest.fixture
def every_worker(sockdir: Path) -> Iterator[tuple[str, Any]]:
    (sockdir / "every_policy.py").write_text(POLICY)
    sys.path.insert(0, str(sockdir))
    module = importlib.import_module("every_policy")
    try:
        with serving("every_policy:EveryTwo", f"ipc://{sockdir}/w.sock") as endpoint:
            yield endpoint, module
    finally:
        sys.path.remove(str(sockdir))
        sys.modules.pop("every_policy", None)


def test_an_act_that_never_reached_the_policy_leaves_the_every_history_whole(
    every_worker: tuple[str, Any], robot: Robot
) -> None:
    endpoint, module = every_worker
    chunks: list[dict[str, Any]] = []

    async def main() -> None:
        client, up, link = await linked(
            endpoint, robot, chunks, 0.2, timing="sync", open_loop_horizon=4
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            for s in range(7):
                rec = robot.step("W", s)
                if s == 4:
                    rec.cams["cam"] = None  # the camera had no frame at step 4
                up.on_step(rec)
                if s in (0, 4, 6):
                    await ask(link, s, "W", s)
                await settle()
            tg.cancel_scope.cancel()
        await client.close()

    run(main)
    assert [c["k"] for c in chunks] == ["rows", "act_failed", "rows"]
    assert "the camera had no frame at that step" in chunks[1]["reason"]
    # The act at 4 never reached the policy: the one at 6 is handed the joints at 2, 4, 6.
    got = module.SEEN[-1]
    assert got["steps"] == [2, 4, 6]
    assert [sorted(o) for o in got["observations"]] == [["joints.pos"]] * 2 + [
        ["cam", "joints.pos"]
    ]
    assert [o["joints.pos"][0] for o in got["observations"]] == [2.0, 4.0, 6.0]


def test_the_act_round_trip_is_measured_from_the_ask(
    every_worker: tuple[str, Any], robot: Robot
) -> None:
    endpoint, _ = every_worker
    chunks: list[dict[str, Any]] = []

    async def main() -> LinkCounters:
        client, up, link = await linked(endpoint, robot, chunks, 0.3)  # up never runs: inline
        robot.step("W", 0)
        started = time.perf_counter()
        await ask(link, 1, "W", 0)
        elapsed = (time.perf_counter() - started) * 1e3
        await client.close()
        assert up.counters.rtt_ms.values[0] == pytest.approx(elapsed, abs=20.0)
        return up.counters

    counters = run(main)
    assert [c["k"] for c in chunks] == ["rows"]
    assert counters.rtt_ms.values[0] >= 300  # the first try's wait is part of the act
    assert counters.inline_frames == 1


def test_timing_samples_stay_bounded() -> None:
    counters = LinkCounters()
    for i in range(TIMING_SAMPLE + 500):
        counters.rtt_ms.add(float(i))
    assert len(counters.rtt_ms) == TIMING_SAMPLE and counters.rtt_ms.seen == TIMING_SAMPLE + 500
    assert sorted(counters.rtt_ms)[-1] >= TIMING_SAMPLE  # late values get in too
    assert np.isfinite(counters.rtt_ms.percentile(99))


class Answering(FakeRouter):
    """Serves requests one at a time (`on_request`); `answer` replies as a worker would."""

    def _serve(self) -> None:
        from robotd import wire

        while not self.stop.is_set():
            if self.sock.poll(20):
                route, body = self.sock.recv_multipart()
                self.on_request(route, wire.unpackb(body))

    def on_request(self, route: bytes, msg: dict[str, Any]) -> None:
        self.answer(route, msg)

    def answer(self, route: bytes, msg: dict[str, Any]) -> None:
        from robotd import wire

        result = {}
        if msg.get("cmd") == "hello":
            result = {"protocol": 1, "contract": {}, "endpoints": {}, "policy": "p:W"}
        self.sock.send_multipart(
            [route, wire.packb({"id": msg["id"], "ok": True, "result": result})]
        )


class Wayward(Answering):
    """Answers the first act late (after the client gave it up) and each request also with
    a reply naming a request that never was."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self.held: list[tuple[bytes, dict[str, Any]]] = []

    def on_request(self, route: bytes, msg: dict[str, Any]) -> None:
        from robotd import wire

        self.sock.send_multipart([route, wire.packb({"id": 999_999, "ok": True})])
        if msg.get("cmd") == "act" and not self.held:
            self.held.append((route, msg))  # answered with the next request, too late
            return
        for late_route, late in self.held:
            self.sock.send_multipart([late_route, wire.packb({"id": late["id"], "ok": True})])
        self.held.clear()
        self.answer(route, msg)


def test_late_and_unknown_replies_are_dropped_and_counted(sockdir: Path) -> None:
    fake = Wayward(f"ipc://{sockdir}/w.sock")
    fake.start()

    try:  # end_episode's reply comes after the late one
        dropped = dropped_after(
            f"ipc://{sockdir}/w.sock", lambda c: c.act("W", 0, [0], [{}], timeout_s=0.3), 5
        )
    finally:
        fake.close()
    late, unknown = dropped["late"], dropped["unknown"]
    assert late == 1 and unknown >= 2  # never handed to a request waiting meanwhile


class Flooder(Answering):
    """Answers each request, after FLOOD replies naming requests that never were."""

    FLOOD = 300

    def on_request(self, route: bytes, msg: dict[str, Any]) -> None:
        from robotd import wire

        for i in range(self.FLOOD):
            self.sock.send_multipart([route, wire.packb({"id": 10**6 + i, "ok": True})])
        self.answer(route, msg)


def test_a_flood_of_unknown_replies_is_counted_whole_and_logged_bounded(
    sockdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = Flooder(f"ipc://{sockdir}/f.sock")
    fake.start()

    try:
        with caplog.at_level(logging.WARNING, logger="robotd.link"):
            unknown = dropped_after(f"ipc://{sockdir}/f.sock", timeout_s=15)["unknown"]
    finally:
        fake.close()
    assert unknown == 2 * Flooder.FLOOD  # every one counted
    said = [r for r in caplog.records if "naming no request of ours" in r.getMessage()]
    assert 1 <= len(said) <= 2, [r.getMessage() for r in said]  # once per 10 s at most


def test_a_worker_error_message_is_cut_to_a_bound() -> None:
    from robotd.link.replies import MAX_ERROR_TEXT, PolicyError, unwrap

    error = {"code": "c" * 1000, "message": "m" * 100_000}
    with pytest.raises(PolicyError) as refused:
        unwrap({"id": 1, "ok": False, "error": error}, "act")
    assert len(refused.value.code) == 64
    assert refused.value.message == "m" * MAX_ERROR_TEXT + "… (100000 characters)"
