"""The worker's frame store, alone and behind a real worker's observe and act sockets."""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import zmq
from serve_util import serving

from robotd import wire
from robotd.contract import Camera
from robotd.frames import fit_and_encode, to_wire
from robotd.link.client import PolicyClient, PolicyError
from robotd.worker.frame import DecodeBudget, Frame
from robotd.worker.server import observe_endpoint
from robotd.worker.store import SKIP_ENTRY_BYTES, FrameStore, StoreLimits

# ---------------------------------------------------------------- the store alone


def frame(tag: int) -> Frame:
    return Frame({"tag": tag})


def test_lookup_hands_each_window_step_its_keys_in_order() -> None:
    store = FrameStore()
    store.post(b"d", "E", 0, {"cam": frame(0), "x": 0.0}, 100)
    store.post(b"d", "E", 3, {"cam": frame(3)}, 100)
    store.post(b"d", "E", 5, {"cam": frame(5), "x": 5.0}, 100)
    look = store.lookup("E", [-2, 0, 3, 5], [["cam"], ["cam", "x"], ["cam"], ["x"]])
    assert look.waiting == [] and look.lost == []
    obs = look.observations
    assert [sorted(o) for o in obs] == [["cam"], ["cam", "x"], ["cam"], ["x"]]
    assert [o["cam"].msg["tag"] for o in obs[:3]] == [0, 0, 3]  # step -2 reads step 0
    assert obs[3]["x"] == 5.0


def test_a_step_posted_twice_is_acknowledged_the_same_and_kept_once() -> None:
    store = FrameStore()
    first = store.post(b"d", "E", 4, {"cam": frame(1)}, 1000)
    again = store.post(b"d", "E", 4, {"cam": frame(2)}, 1000)
    assert first == again == (4, None)
    assert store.held("E") == (1, 1000)
    look = store.lookup("E", [4], [["cam"]])
    assert look.observations[0]["cam"].msg["tag"] == 1  # the first copy is the one kept
    store.post(b"d", "E", 4, {"x": 1.0}, 10)  # another key of the same step is new
    assert store.held("E") == (1, 1010)


def test_missing_keys_wait_and_skipped_or_released_ones_are_lost() -> None:
    store = FrameStore()
    store.post(b"d", "E", 2, {"cam": frame(2)}, 10)
    store.skip(b"d", "E", 3, ["cam"], "overwritten")
    look = store.lookup("E", [2, 3, 4], [["cam", "x"], ["cam"], ["cam"]])
    assert look.observations is None
    assert look.waiting == [(2, "x"), (4, "cam")]
    assert look.lost == [(3, "cam", "overwritten")]
    store.release("E", 3)
    assert store.held("E") == (0, SKIP_ENTRY_BYTES)  # step 3's skip is still held
    look = store.lookup("E", [2, 4], [["cam"], ["cam"]])
    assert look.lost == [(2, "cam", "released (below step 3)")] and look.waiting == [(4, "cam")]
    through, refusal = store.post(b"d", "E", 1, {"cam": frame(1)}, 10)
    assert through == 3
    assert refusal is not None and refusal.code == "released"


@pytest.mark.parametrize(
    ("limits", "code"),
    [
        (StoreLimits(episode_frames=2), "episode_frames"),
        (StoreLimits(episode_bytes=250), "episode_bytes"),
        (StoreLimits(worker_bytes=250), "worker_bytes"),
    ],
)
def test_a_post_over_a_limit_is_refused_whole_naming_the_limit(
    limits: StoreLimits, code: str
) -> None:
    store = FrameStore(limits)
    assert store.post(b"d", "E", 0, {"cam": frame(0)}, 100) == (0, None)
    assert store.post(b"d", "E", 1, {"cam": frame(1)}, 100) == (1, None)
    through, refusal = store.post(b"d", "E", 2, {"cam": frame(2), "x": 1.0}, 100)
    assert refusal is not None and refusal.code == code
    assert "step 2 refused" in refusal.message and code.split("_")[1] in refusal.message
    assert through == 1 and store.held("E") == (2, 200)
    # Nothing of it was kept, and an act reading it is told so at once, with the reason.
    look = store.lookup("E", [2], [["cam", "x"]])
    assert look.waiting == []
    assert look.lost == [(2, k, f"refused: {refusal.message}") for k in ("cam", "x")]
    store.post(b"d", "E", 3, {"y": 1.0}, 1)
    assert store.through("E") == 1  # held below the refused step until it is released
    store.release("E", 1)
    # cam is kept now; x, not posted again, still holds `through` below step 2.
    assert store.post(b"d", "E", 2, {"cam": frame(2)}, 100) == (1, None)
    look = store.lookup("E", [2], [["cam", "x"]])
    assert look.lost == [(2, "x", f"refused: {refusal.message}")]
    assert store.post(b"d", "E", 2, {"x": 1.0}, 1) == (3, None)


def test_the_worker_limit_counts_every_episode() -> None:
    store = FrameStore(StoreLimits(worker_bytes=300))
    store.post(b"a", "A", 0, {"cam": frame(0)}, 200)
    _, refusal = store.post(b"b", "B", 0, {"cam": frame(0)}, 200)
    assert refusal is not None and refusal.code == "worker_bytes"
    store.drop("A")
    assert store.post(b"b", "B", 0, {"cam": frame(0)}, 200) == (0, None)
    assert store.nbytes == 200


def test_a_newer_episode_of_the_same_daemon_frees_the_older_one() -> None:
    now = [0.0]
    store = FrameStore(StoreLimits(idle_s=60), clock=lambda: now[0])
    store.post(b"one", "E1", 0, {"cam": frame(0)}, 100)
    store.post(b"two", "F1", 0, {"cam": frame(0)}, 100)
    store.post(b"one", "E2", 0, {"cam": frame(0)}, 100)
    assert sorted(store.episodes()) == ["E2", "F1"] and store.nbytes == 200
    now[0] = 61.0  # F1's daemon went quiet: freed on the next post
    store.post(b"one", "E2", 1, {"cam": frame(1)}, 100)
    assert store.episodes() == ["E2"] and store.nbytes == 200


def test_skips_count_against_the_limits_and_absurd_ones_are_refused() -> None:
    store = FrameStore(StoreLimits(episode_bytes=8 * SKIP_ENTRY_BYTES), keys=["cam", "x"])
    assert store.skip(b"d", "E", 0, ["cam"], "lost") == (0, None)
    assert store.skip(b"d", "E", 0, ["cam"], "lost again") == (0, None)  # kept once
    assert store.held("E") == (0, SKIP_ENTRY_BYTES)
    _, refusal = store.skip(b"d", "E", 1, ["cam", "nope"], "lost")
    assert refusal is not None and refusal.code == "bad_skip"
    assert "['nope'] are not streams of the contract" in refusal.message
    _, refusal = store.skip(b"d", "E", 1, ["cam", "x", "cam"], "lost")
    assert refusal is not None and "3 keys, more than the contract has streams" in refusal.message
    for step in range(1, 4):
        assert store.skip(b"d", "E", step, ["cam", "x"], "lost")[1] is None
    _, refusal = store.skip(b"d", "E", 4, ["cam", "x"], "lost")  # 9 entries: over the limit
    assert refusal is not None and refusal.code == "episode_bytes"
    assert refusal.message.startswith("skip: ") and "limit 1024" in refusal.message
    assert store.lookup("E", [4], [["cam"]]).waiting == [(4, "cam")]  # nothing of it kept
    assert store.held("E") == (0, 7 * SKIP_ENTRY_BYTES) and store.nbytes == 7 * SKIP_ENTRY_BYTES
    store.release("E", 4)
    assert store.held("E") == (0, 0) and store.nbytes == 0
    unknown = FrameStore()  # no contract known: at most 64 keys a skip
    assert unknown.skip(b"d", "E", 0, [f"k{i}" for i in range(65)], "lost")[1] is not None


def test_frames_are_decoded_ahead_once_within_a_budget_and_freed_with_their_steps() -> None:
    decoded: list[int] = []

    def decode(msg: dict[str, Any]) -> np.ndarray:
        if msg["tag"] < 0:
            raise ValueError("corrupt")
        decoded.append(msg["tag"])
        return np.full(100, msg["tag"], np.uint8)

    budget = DecodeBudget(250)
    store = FrameStore(on_frame=lambda key, f: f.ahead(decode, budget, 100))
    for step in range(3):
        store.post(b"d", "E", step, {"cam": frame(step)}, 10)
    assert decoded == [0, 1] and budget.held == 200  # the third did not fit the budget
    frames = [o["cam"] for o in store.lookup("E", [0, 1, 2], [["cam"]] * 3).observations]
    values = [f.value(decode) for f in frames]
    assert decoded == [0, 1, 2]  # the first two were not decoded again
    assert values[0] is frames[0].value(decode) and values[2][0] == 2
    assert not values[0].flags.writeable  # shared by every act reading it
    store.release("E", 1)
    assert frames[0].released and budget.held == 200  # an act may still read it...
    del frames, values
    assert budget.held == 100  # ...until it is gone
    store.post(b"d", "E", 3, {"cam": frame(-1)}, 10)
    assert budget.held == 100  # a frame that does not decode is left to the act
    with pytest.raises(ValueError, match="corrupt"):
        store.lookup("E", [3], [["cam"]]).observations[0]["cam"].value(decode)
    store.drop("E")
    assert budget.held == 0
    late = Frame({"tag": 9})
    late.released = True
    assert not late.ahead(decode, budget, 100) and decoded == [0, 1, 2]


# ---------------------------------------------------------------- behind a real worker

POLICY = textwrap.dedent("""
    import numpy as np
    from robotd.contract import Actions, Camera, Observations, Stream

    SEEN = []

    class Recorder:
        observations = Observations(streams={
            "cam": Stream(at=[-2, 0], camera=Camera(codec="jpeg", quality=95,
                                                    layout="chw_float")),
            "top": Stream(at=[0]),
            "x": Stream(every=2),
        })
        actions = Actions(open_loop_horizon=2)

        def infer(self, inputs):
            SEEN.append(inputs)
            return np.full((2, 1), float(inputs["steps"][-1]))
""")
CAM = Camera(codec="jpeg", quality=95, layout="chw_float")


def image(value: int, h: int = 24, w: int = 32) -> np.ndarray:
    return np.full((h, w, 3), value, dtype=np.uint8)


@pytest.fixture(scope="module")
def worker() -> Iterator[tuple[str, Any]]:
    """A real worker (serve, in a thread) on ipc, with a small frame limit; yields its act
    endpoint and the policy module (whose SEEN lists what infer was handed)."""
    tmp = Path(tempfile.mkdtemp(prefix="robotd-st-"))  # ipc paths must stay short
    (tmp / "store_policy.py").write_text(POLICY)
    sys.path.insert(0, str(tmp))
    module = importlib.import_module("store_policy")
    spec = ("store_policy:Recorder", f"ipc://{tmp}/w.sock")
    try:
        with serving(*spec, limits=StoreLimits(episode_frames=6)) as endpoint:
            yield endpoint, module
    finally:
        sys.path.remove(str(tmp))
        sys.modules.pop("store_policy", None)
        shutil.rmtree(tmp, ignore_errors=True)


class Observe:
    """A bare DEALER on the observe socket: one upload, one acknowledgement."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 5000)
        self.sock.connect(endpoint)
        self.rid = 0

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.rid += 1
        self.sock.send(wire.packb({"id": self.rid, **msg}))
        reply = wire.unpackb(self.sock.recv())
        assert reply["id"] == self.rid
        return reply

    def post(self, episode: str, step: int, **keys: Any) -> dict[str, Any]:
        frames = {k: to_wire(fit_and_encode(v, CAM)) for k, v in keys.items() if k == "cam"}
        frames.update({k: to_wire(fit_and_encode(v, None)) for k, v in keys.items() if k == "top"})
        values = {k: v for k, v in keys.items() if k not in frames}
        reply = self.request(
            {"cmd": "post", "episode": episode, "step": step, "values": values, "frames": frames}
        )
        assert reply["ok"], reply
        return reply["result"]

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def run(fn: Any) -> Any:
    return anyio.run(fn, backend_options={"use_uvloop": True})


async def connect(endpoint: str) -> tuple[PolicyClient, Observe]:
    client = PolicyClient(endpoint, timeout_s=10)
    hello = await client.connect(observe=True)
    assert hello.endpoints["observe"] == observe_endpoint(endpoint)
    assert hello.limits == {"episode_frames": 6, "episode_bytes": 64 << 20, "worker_bytes": 1 << 30}
    return client, Observe(hello.endpoints["observe"])


def test_only_a_client_that_uploads_is_told_the_observe_endpoint(worker) -> None:
    async def main() -> None:
        client = PolicyClient(worker[0], timeout_s=10)
        assert (await client.connect()).endpoints == {"observe": None}
        await client.close()

    run(main)


def test_the_policy_gets_the_named_window_decoded_in_order(worker) -> None:
    endpoint, module = worker

    async def main() -> None:
        client, obs = await connect(endpoint)
        assert obs.post("A1", 0, cam=image(10), x=np.array([0.0]))["through"] == 0
        obs.post("A1", 2, x=np.array([2.0]))
        obs.post("A1", 3, cam=image(30), top=image(33, 6, 8))
        module.SEEN.clear()
        result = await client.act_steps(
            "A1",
            3,
            [0, 1, 2, 3],
            [["x"], ["cam"], ["x"], ["cam", "top", "x"]],
            inline=[
                {
                    "step": 1,
                    "values": {},
                    "frames": {"cam": to_wire(fit_and_encode(image(20), CAM))},
                },
                {"step": 3, "values": {"x": 3.0}, "frames": {}},
            ],
        )
        assert result.actions[0, 0] == 3.0
        got = module.SEEN[-1]
        assert got["steps"] == [0, 1, 2, 3]
        assert [sorted(o) for o in got["observations"]] == [
            ["x"],
            ["cam"],
            ["x"],
            ["cam", "top", "x"],
        ]
        cams = [got["observations"][i]["cam"] for i in (1, 3)]
        for arr, value in zip(cams, (20, 30)):
            assert arr.dtype == np.float32 and arr.shape == (3, 24, 32)  # chw_float
            assert np.allclose(arr, value / 255, atol=2 / 255)
        top = got["observations"][3]["top"]
        assert top.dtype == np.uint8 and top.shape == (6, 8, 3) and (top == 33).all()
        assert got["observations"][3]["x"] == 3.0  # inline wins, step 3's x was not posted
        await client.close()
        obs.close()

    run(main)


def test_an_act_waits_for_uploads_without_blocking_the_worker(worker) -> None:
    endpoint, module = worker

    async def main() -> None:
        client, obs = await connect(endpoint)
        result: list[Any] = []

        async def act() -> None:
            result.append(await client.act_steps("B1", 2, [0, 2], [["cam"], ["cam", "top"]]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(act)
            await anyio.sleep(0)  # the act is sent before its steps
            obs.post("B1", 0, cam=image(1))
            other = PolicyClient(endpoint, timeout_s=5)  # the worker answers meanwhile
            assert (await other.connect()).policy == "store_policy:Recorder"
            await other.close()
            assert not result
            obs.post("B1", 2, cam=image(2), top=image(3, 6, 8))
        assert result[0].step == 2
        assert module.SEEN[-1]["steps"] == [0, 2]
        await client.close()
        obs.close()

    run(main)


def test_missing_steps_are_named_then_sent_inline(worker) -> None:
    endpoint, _ = worker

    async def main() -> None:
        client, obs = await connect(endpoint)
        obs.post("C1", 4, cam=image(4))
        skip = obs.request(
            {
                "cmd": "skip",
                "episode": "C1",
                "step": 5,
                "keys": ["top"],
                "reason": "frame overwritten",
            }
        )
        assert skip["ok"] and skip["result"]["through"] == 5
        with pytest.raises(PolicyError) as err:  # step 5 'top' will never come: no waiting
            await client.act_steps("C1", 6, [4, 5, 6], [["cam"], ["top"], ["cam"]], wait_s=0.2)
        assert err.value.code == "missing_steps"
        assert err.value.missing() == [
            (5, "top", "frame overwritten"),
            (6, "cam", "not arrived yet"),
        ]
        assert "step 5 'top' (frame overwritten)" in err.value.message
        inline = [
            {
                "step": 5,
                "values": {},
                "frames": {"top": to_wire(fit_and_encode(image(5, 6, 8), None))},
            },
            {"step": 6, "values": {}, "frames": {"cam": to_wire(fit_and_encode(image(6), CAM))}},
        ]
        result = await client.act_steps(
            "C1", 6, [4, 5, 6], [["cam"], ["top"], ["cam"]], inline=inline, wait_s=0.2
        )
        assert result.step == 6
        await client.close()
        obs.close()

    run(main)


def test_refusals_name_the_limit_and_release_makes_room(worker) -> None:
    endpoint, _ = worker

    async def main() -> None:
        client, obs = await connect(endpoint)
        for step in range(6):
            assert obs.post("D1", step, cam=image(step))["refused"] is None
        refused = obs.post("D1", 6, cam=image(6))
        assert refused["refused"]["code"] == "episode_frames"
        assert "7 frames (limit 6)" in refused["refused"]["message"]
        assert refused["through"] == 5
        # The act at step 5 releases the steps below 4 once it is handed to the policy.
        await client.act_steps("D1", 5, [3, 5], [["cam"], ["cam"]], release_below=4)
        assert obs.post("D1", 6, cam=image(6))["refused"] is None
        with pytest.raises(PolicyError) as err:
            await client.act_steps("D1", 6, [3, 6], [["cam"], ["cam"]], wait_s=0)
        assert err.value.missing() == [(3, "cam", "released (below step 4)")]
        await client.end_episode("D1")
        with pytest.raises(PolicyError) as err:  # its frames went with it
            await client.act_steps("D1", 6, [6], [["cam"]], wait_s=0)
        assert err.value.code == "missing_steps"
        await client.close()
        obs.close()

    run(main)


@pytest.mark.parametrize(
    ("msg", "needle"),
    [
        ({"cmd": "post", "episode": "E", "step": -1}, "field 'step'"),
        ({"cmd": "post", "episode": "", "step": 0}, "field 'episode'"),
        ({"cmd": "post", "episode": "E", "step": 0, "values": [1]}, "field 'values'"),
        ({"cmd": "post", "episode": "E", "step": 0, "frames": {"c": 3}}, "field 'frames.c'"),
        (
            {"cmd": "post", "episode": "E", "step": 0, "values": {"c": 1}, "frames": {"c": {}}},
            "both",
        ),
        ({"cmd": "skip", "episode": "E", "step": 0, "keys": "cam"}, "field 'keys'"),
        ({"cmd": "drop", "episode": "E", "step": 0}, "unknown upload command"),
    ],
)
def test_bad_uploads_get_error_replies_naming_the_field(worker, msg: dict, needle: str) -> None:
    endpoint, _ = worker

    async def main() -> None:
        client, obs = await connect(endpoint)
        reply = obs.request(msg)
        assert reply["ok"] is False and needle in reply["error"]["message"]
        assert obs.post("E9", 0, x=1.0)["refused"] is None  # and the worker goes on
        await client.close()
        obs.close()

    run(main)


def test_a_corrupt_frame_is_an_error_naming_step_and_key(worker) -> None:
    endpoint, _ = worker

    async def main() -> None:
        client, obs = await connect(endpoint)
        bad = {"codec": "jpeg", "shape": [24, 32, 3], "data": b"\xff\xd8 not a jpeg"}
        reply = obs.request(
            {"cmd": "post", "episode": "F1", "step": 0, "values": {}, "frames": {"cam": bad}}
        )
        assert reply["ok"]
        with pytest.raises(PolicyError) as err:
            await client.act_steps("F1", 0, [0], [["cam"]])
        assert err.value.code == "bad_frame" and "step 0 key 'cam'" in err.value.message
        await client.close()
        obs.close()

    run(main)


def test_an_act_reading_a_refused_upload_is_answered_at_once(worker) -> None:
    endpoint, _ = worker

    async def main() -> None:
        client, obs = await connect(endpoint)
        for step in range(6):
            assert obs.post("G1", step, cam=image(step))["refused"] is None
        errors: list[PolicyError] = []

        async def act() -> None:
            with pytest.raises(PolicyError) as err:
                await client.act_steps("G1", 6, [6], [["cam"]], wait_s=60)
            errors.append(err.value)

        with anyio.fail_after(10):  # far less than the act's wait
            async with anyio.create_task_group() as tg:
                tg.start_soon(act)
                await anyio.sleep(0)  # the act is sent before its step
                assert obs.post("G1", 6, cam=image(6))["refused"]["code"] == "episode_frames"
        assert errors[0].code == "missing_steps"
        [(step, key, why)] = errors[0].missing()
        assert (step, key) == (6, "cam")
        assert why.startswith("refused: ") and "7 frames (limit 6)" in why
        await client.close()
        obs.close()

    run(main)
