"""The daemon's upload scheduler (robotd.link.uplink) over a real DEALER, against a recording
observe socket, real shared-memory camera rings and, for the act path, a real worker."""

from __future__ import annotations

import functools
import importlib
import logging
import os
import shutil
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from robotd.contract import Actions, Camera, Observations, Stream
from robotd.lane.messages import Ask, Merged, Step
from robotd.link.act import ActLink
from robotd.link.chunks import ChunkLimits
from robotd.link.client import PolicyClient
from robotd.link.steps import FrameLost, LinkCounters, RingFrames, StepReader, StepRing
from robotd.link.uplink import Uplink, UplinkLimits
from robotd.link.windows import WindowPlanner
from robotd.shm import FrameRing
from tests.fake_router import FakeRouter
from tests.lane_util import plain
from tests.serve_util import serving

HZ = 30.0
KEYS = ["cam", "joints.pos", "joints.vel"]
SHAPE = (24, 32, 3)


class FakeObserve(FakeRouter):
    """A worker's observe socket that records every upload and answers it (`answer`)."""

    def __init__(
        self,
        endpoint: str,
        answer: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda m: None,
    ) -> None:
        super().__init__(endpoint)
        self.answer = answer
        self.got: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        self.start()

    def reply(self, msg: dict[str, Any]) -> Any:
        result = {
            "episode": msg["episode"],
            "step": msg["step"],
            "through": msg["step"],
            "refused": self.answer(msg),
        }
        return {"id": msg["id"], "ok": True, "result": result}

    def seen(self, msg: dict[str, Any]) -> None:
        with self.changed:
            self.got.append(msg)
            self.changed.notify_all()

    async def wait_for(self, n: int, timeout: float = 5.0) -> None:
        await self.wait_until(lambda: len(self.got) >= n, timeout)

    async def wait_until(self, cond: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait, without blocking the event loop the uploads run on, for `cond`."""
        with anyio.fail_after(timeout):
            while True:
                with self.changed:
                    if cond():
                        return
                await anyio.sleep(0.005)

    def posts(self) -> list[tuple[int, str]]:
        """(step, key) of every post, in arrival order."""
        return [
            (m["step"], k)
            for m in self.got
            if m["cmd"] == "post"
            for k in sorted({**m["values"], **m["frames"]})
        ]

    def skips(self) -> list[tuple[int, list[str], str]]:
        return [(m["step"], m["keys"], m["reason"]) for m in self.got if m["cmd"] == "skip"]


def refuse_step(
    step: int, code: str, message: str, *, times: int | None = None
) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """A FakeObserve answer refusing the uploads of `step` with `code` and `message`: the
    first `times` of them (None: every one). Every other upload is taken."""
    left = [times]

    def answer(msg: dict[str, Any]) -> dict[str, Any] | None:
        if msg["step"] != step or left[0] == 0:
            return None
        if left[0] is not None:
            left[0] -= 1
        return {"code": code, "message": message}

    return answer


class Robot:
    """A camera ring in shared memory and the step records the control lane would send."""

    def __init__(self, slots: int = 64) -> None:
        self.ring = FrameRing.create(f"robotd-test-up-{os.getpid()}-{id(self)}", SHAPE, slots)
        self.steps = StepRing(keep=256)

    def step(self, wep: str, s: int) -> Step:
        index = self.ring.write(np.full(SHAPE, s % 256, np.uint8), 1000 + s)
        rec = Step(
            1, wep, s, 1000 + s, [float(s), 0.5], [0.0, -float(s)], {"cam": (index, 1000 + s)}, True
        )
        self.steps.add(rec)
        return rec

    def close(self) -> None:
        self.ring.close()
        self.ring.unlink()


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="robotd-up-"))  # ipc paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def robot() -> Iterator[Robot]:
    r = Robot()
    yield r
    r.close()


def planner(**streams: Stream) -> WindowPlanner:
    return WindowPlanner(Observations(streams=streams).resolve(HZ), KEYS)


def reader(robot: Robot) -> StepReader:
    return StepReader(robot.steps, RingFrames({"cam": robot.ring}))


def merged(d: dict[str, Any]) -> Merged:
    """A merge report from the fields a test names (the rest as a plain merge has them)."""
    return Merged(
        0,
        d["wep"],
        d["from"],
        d["at"],
        d["rows"],
        d.get("dropped", 0),
        d.get("stale", False),
        d.get("refill", 0),
    )


async def ask(link: ActLink, ask_id: int, wep: str, s: int, queue: int = 0) -> None:
    """One ask taken up and its act finished, as the policy session does."""
    act = link.begin(Ask(ask_id, wep, s, 1, queue))
    if act is not None:
        await link.finish(act)


def make_uplink(endpoint: str, plan: WindowPlanner, robot: Robot, **kwargs: Any) -> Uplink:
    return Uplink(
        endpoint,
        plan,
        reader(robot),
        {"cam": Camera(codec="png")},
        LinkCounters(),
        **kwargs,
    )


def observed(
    sockdir: Path,
    plan: WindowPlanner,
    robot: Robot,
    answer: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda m: None,
    **kwargs: Any,
) -> tuple[FakeObserve, Uplink]:
    """A recording observe socket in `sockdir` (answering with `answer`) and an uplink to it
    (`kwargs` as Uplink takes them), not running yet. The caller closes the socket."""
    fake = FakeObserve(f"ipc://{sockdir}/o.sock", answer)
    return fake, make_uplink(f"ipc://{sockdir}/o.sock", plan, robot, **kwargs)


def make_act_link(
    client: PolicyClient,
    plan: WindowPlanner,
    robot: Robot,
    up: Uplink,
    chunks: list[dict[str, Any]],
    *,
    actions: Actions | None,
    stream_wait_s: float,
) -> ActLink:
    """An act link as the policy session builds it, at HZ, uploading through `up` and
    counting in its counters; every message it sends the lane lands, plain, in `chunks`."""
    return ActLink(
        client,
        plan,
        reader(robot),
        lambda m: chunks.append(plain(m)),
        control_hz=HZ,
        actions=actions,
        limits=ChunkLimits(),
        uplink=up,
        stream_wait_s=stream_wait_s,
        counters=up.counters,
    )


def run(fn: Any) -> Any:
    return anyio.run(fn, backend_options={"use_uvloop": True})


async def settle() -> None:
    """Let the uplink's tasks (encoding in threads, sending) catch up with a step."""
    await anyio.sleep(0.01)


async def feed(up: Uplink, robot: Robot, steps: range) -> None:
    """Make each of `steps` in episode W and hand it to the uplink, letting it catch up
    after each, as the control lane's step records would arrive."""
    for s in steps:
        up.on_step(robot.step("W", s))
        await settle()


async def drive_sync(
    up: Uplink, plan: WindowPlanner, robot: Robot, steps: int, *, olh: int, latency: int, rows: int
) -> list[dict[int, frozenset[str]]]:
    """The sync kernel's timing: ask when the queue is empty, the chunk merged `latency`
    steps later, its min(rows, olh) rows played. Returns each act's needed steps and keys."""
    acts: list[dict[int, frozenset[str]]] = []
    prev, asked, merge_at, queue = None, None, None, 0
    for s in range(steps):
        up.on_step(robot.step("W", s))
        if s == merge_at:
            up.on_chunk(Merged(0, "W", asked, s, rows, 0, False))
            up.released("W", up.release_point(asked))
            queue, merge_at = min(rows, olh), None
        if queue == 0 and merge_at is None:
            needed = plan.needed(s, prev)
            up.on_ask("W", s, 0)
            up.ensure("W", needed)
            acts.append(needed)
            prev, asked, merge_at = s, s, s + latency
        queue = max(0, queue - 1)
        await settle()
    return acts


def read_by(acts: list[dict[int, frozenset[str]]]) -> set[tuple[int, str]]:
    return {(s, k) for needed in acts for s, keys in needed.items() for k in keys}


@pytest.mark.parametrize("latency", [1, 3])
def test_sync_uploads_exactly_what_the_acts_read_each_once_ahead(
    sockdir: Path, robot: Robot, latency: int
) -> None:
    plan = planner(
        cam=Stream(at=[-6, 0]), **{"joints.pos": Stream(), "joints.vel": Stream(every=2)}
    )
    fake, up = observed(sockdir, plan, robot, timing="sync", open_loop_horizon=5)

    expected: set[tuple[int, str]] = set()

    async def main() -> list[dict[int, frozenset[str]]]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            acts = await drive_sync(up, plan, robot, 40, olh=5, latency=latency, rows=8)
            # What the acts read, and what the next act (not asked yet) will read.
            expected.update(read_by(acts))
            last = max(max(needed) for needed in acts)
            expected.update(
                (s, k) for s in range(last + 1, 40) for k in plan.every_keys_at(s, last)
            )
            upcoming = up.predicted("W")
            if upcoming is not None:
                expected.update(
                    (s, k)
                    for s, keys in plan.needed(upcoming, last).items()
                    for k in keys
                    if s < 40
                )
            await fake.wait_until(lambda: set(fake.posts()) >= expected)
            await settle()
            tg.cancel_scope.cancel()
        return acts

    try:
        acts = run(main)
        posted = fake.posts()
    finally:
        fake.close()
    assert len(acts) >= 5
    assert len(posted) == len(set(posted))  # never twice
    assert set(posted) == expected  # only what some act reads, and all of it
    assert up.mispredicted == 0  # every step went up as made, none just before its act
    assert up.counters.uploaded_frames == sum(k == "cam" for _, k in posted)
    assert up.counters.skipped_frames == up.counters.inline_frames == 0


def test_realtime_predicts_from_the_merged_queue(sockdir: Path, robot: Robot) -> None:
    plan = planner(cam=Stream(at=[-4, 0]))
    fake, up = observed(sockdir, plan, robot, timing="realtime")

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            for s in range(4):
                up.on_step(robot.step("W", s))
                if s == 0:
                    up.on_ask("W", 0, 0)
                    up.ensure("W", plan.needed(0, None))
                await settle()
            # The chunk from step 0 (10 rows) merges at step 3: 3 rows dropped, 7 queued,
            # so the next ask comes when 2 remain: at step 3 + 5 = 8, reading steps 4 and 8.
            report = {"wep": "W", "from": 0, "at": 3, "rows": 10, "dropped": 3, "refill": 2}
            up.on_chunk(merged(report))
            await feed(up, robot, range(4, 9))
            up.on_ask("W", 8, 2)
            up.ensure("W", plan.needed(8, 0))
            await fake.wait_for(3)
            await settle()
            tg.cancel_scope.cancel()

    try:
        run(main)
        assert fake.posts() == [(0, "cam"), (4, "cam"), (8, "cam")]
        assert up.mispredicted == 0
    finally:
        fake.close()


def test_a_mispredicted_step_goes_up_just_before_the_act(sockdir: Path, robot: Robot) -> None:
    plan = planner(cam=Stream(at=[-4, 0]))
    fake, up = observed(sockdir, plan, robot, timing="sync", open_loop_horizon=4)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            up.on_step(robot.step("W", 0))
            up.on_ask("W", 0, 0)
            up.on_chunk(merged({"wep": "W", "from": 0, "at": 1, "rows": 8}))  # next ask: 5
            await feed(up, robot, range(1, 8))
            # ...but it came at 7 (say an act failed and was asked again): 3 and 7 go now.
            up.on_ask("W", 7, 0)
            up.ensure("W", plan.needed(7, 0))
            await fake.wait_for(5)
            tg.cancel_scope.cancel()

    try:
        run(main)
        assert fake.posts() == [(0, "cam"), (1, "cam"), (5, "cam"), (3, "cam"), (7, "cam")]
        assert up.mispredicted == 2
    finally:
        fake.close()


def test_a_frame_overwritten_in_the_ring_is_declared_skipped(sockdir: Path) -> None:
    robot = Robot(slots=4)
    plan = planner(cam=Stream(at=[-6, 0]))
    fake, up = observed(sockdir, plan, robot, timing="sync", open_loop_horizon=8)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            for s in range(8):  # the 4-slot ring holds frames 4..7 by now
                robot.step("W", s)
            up.on_ask("W", 7, 0)
            up.ensure("W", plan.needed(7, None))  # reads steps 1 and 7
            await fake.wait_for(2)
            with pytest.raises(FrameLost, match="step 1"):
                await up.inline("W", [(1, "cam")])
            inline = await up.inline("W", [(7, "cam")])
            assert inline[0]["step"] == 7 and inline[0]["frames"]["cam"]["codec"] == "png"
            tg.cancel_scope.cancel()

    try:
        run(main)
        assert fake.skips() == [
            (1, ["cam"], "frame overwritten in its camera ring before it was read")
        ]
        assert fake.posts() == [(7, "cam")]  # never a wrong frame in step 1's place
        assert up.counters.skipped_frames == 1 and up.counters.inline_frames == 1
    finally:
        fake.close()
        robot.close()


@pytest.mark.parametrize("when_behind", ["wait", "drop_oldest"])
def test_uploads_over_the_limit_wait_or_give_up_the_oldest(
    sockdir: Path, robot: Robot, when_behind: str, caplog: pytest.LogCaptureFixture
) -> None:
    plan = planner(cam=Stream(every=1))  # every step goes up
    fake, up = observed(
        sockdir, plan, robot, limits=UplinkLimits(2, 1 << 30), when_behind=when_behind
    )

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            await feed(up, robot, range(5))
            await fake.wait_for(2 if when_behind == "wait" else 4)
            await settle()
            sent_before = fake.posts()
            up.released("W", 2)  # an act was handed steps 0..1: room for two more
            await fake.wait_for(4 if when_behind == "wait" else 5)
            await settle()
            tg.cancel_scope.cancel()
            return sent_before

    caplog.set_level(logging.WARNING, "robotd.link")
    try:
        before = run(main)
        after = fake.posts()
    finally:
        fake.close()
    assert before == [(0, "cam"), (1, "cam")]
    if when_behind == "wait":
        assert after == [(s, "cam") for s in range(4)]  # the rest went up as room came
        assert fake.skips() == [] and up.counters.skipped_frames == 0
    else:
        # Steps 2..4 waited while the worker held 0 and 1: in flight over the limit, so the
        # oldest pending (2, then 3) were given up; the newest (4) went up once room came.
        assert [s for s, _, _ in fake.skips()] == [2, 3]
        assert "oldest pending given up" in fake.skips()[0][2]
        assert after == [(0, "cam"), (1, "cam"), (4, "cam")]
        assert up.counters.skipped_frames == 2 and up.conn.given_up == 2
        assert "declared skipped" in caplog.text


def test_refused_uploads_are_counted_and_warned(
    sockdir: Path, robot: Robot, caplog: pytest.LogCaptureFixture
) -> None:
    answer = refuse_step(1, "worker_bytes", "the worker would hold too much")
    fake, up = observed(sockdir, planner(cam=Stream(every=1)), robot, answer)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(up.run)
            await feed(up, robot, range(3))
            await fake.wait_for(3)
            await settle()
            tg.cancel_scope.cancel()

    caplog.set_level(logging.WARNING, "robotd.link")
    try:
        run(main)
    finally:
        fake.close()
    assert up.counters.refused_frames == 1 and up.counters.uploaded_frames == 3
    assert "refused step 1: the worker would hold too much" in caplog.text


POLICY = textwrap.dedent("""
    import numpy as np
    from robotd.contract import Actions, Camera, Observations, Stream

    SEEN = []

    class Windowed:
        observations = Observations(streams={"cam": Stream(at=[-2, 0],
                                             camera=Camera(codec="png")),
                                             "joints.pos": Stream()})
        actions = Actions(open_loop_horizon=4)

        def infer(self, inputs):
            SEEN.append(inputs)
            return np.zeros((4, 2))
""")


def test_what_the_worker_lacks_goes_inline_and_the_act_is_asked_again(
    sockdir: Path, robot: Robot
) -> None:
    (sockdir / "uplink_policy.py").write_text(POLICY)
    sys.path.insert(0, str(sockdir))
    module = importlib.import_module("uplink_policy")
    chunks: list[dict[str, Any]] = []

    async def main(endpoint: str) -> None:
        client = PolicyClient(endpoint, timeout_s=10)
        hello = await client.connect(observe=True)
        plan = WindowPlanner(hello.observations.resolve(HZ), KEYS)
        # An uplink that never runs: nothing goes up ahead, so the worker lacks it all.
        up = make_uplink(hello.endpoints["observe"], plan, robot)
        link = make_act_link(
            client, plan, robot, up, chunks, actions=hello.actions, stream_wait_s=0.2
        )
        for s in range(4):
            robot.step("W", s)
        await ask(link, 1, "W", 3)
        await client.close()

    try:
        with serving("uplink_policy:Windowed", f"ipc://{sockdir}/w.sock") as endpoint:
            run(functools.partial(main, endpoint))
    finally:
        sys.path.remove(str(sockdir))
        sys.modules.pop("uplink_policy", None)
    assert [c["k"] for c in chunks] == ["rows"]
    got = module.SEEN[-1]
    assert got["steps"] == [1, 3]
    assert [o["cam"][0, 0, 0] for o in got["observations"]] == [1, 3]
    assert got["observations"][1]["joints.pos"].tolist() == [3.0, 0.5]
