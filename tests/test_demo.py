"""The demo policy: the planned tip path follows the dot's predicted path."""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path

import anyio
import cv2
import numpy as np
import pytest
from serve_util import serving

from drivers.sim import geometry as g
from robotd import wire
from robotd.contract import Actions, Camera, Observations, Stream
from robotd.demo import DotFollower
from robotd.link.client import PolicyClient

W, H = 640, 480
HZ = 30.0
PIXEL = (g.TOP_VIEW[2] - g.TOP_VIEW[0]) / W  # world units per pixel


def frame(dot: np.ndarray | None, w: int = W, h: int = H) -> np.ndarray:
    """A top-camera frame with the dot drawn at its world position, as it arrives off the
    wire (read-only)."""
    img = np.full((h, w, 3), g.BACKGROUND, np.uint8)
    cv2.rectangle(img, (10, 10), (60, 40), g.ARM_COLOUR, -1)  # distractors
    cv2.circle(img, (w - 40, h - 40), 8, g.TIP_COLOUR, -1)
    if dot is not None:
        u, v = g.world_to_pixel(dot, g.TOP_VIEW, w, h)
        radius = max(2, round(g.DOT_RADIUS / PIXEL))
        cv2.circle(img, (round(u), round(v)), radius, g.DOT_COLOUR, -1)
    return wire.unpackb(wire.packb(img))


def window(
    t: int, back: int, p_then: np.ndarray | None, p_now: np.ndarray | None, q: np.ndarray
) -> dict:
    return {
        "observations": [{"top": frame(p_then)}, {"top": frame(p_now), "joints.pos": q}],
        "steps": [t - back, t],
    }


def tips(rows: np.ndarray) -> np.ndarray:
    return np.array([g.forward(r)[1] for r in rows])


def test_contract_is_declared_per_instance() -> None:
    camera = Camera(width=224, height=224, resize="pad", codec="jpeg", quality=90)
    assert DotFollower.observations == Observations(
        streams={"top": Stream(at=[-3, 0], camera=camera), "joints.pos": Stream()}
    )
    policy = DotFollower(lookback=5, hz=15.0, horizon=12)
    assert policy.observations.streams["top"].at == [-5, 0]
    assert policy.actions == Actions(hz=15.0, open_loop_horizon=8, rtc=True)
    assert DotFollower(rtc=False).actions.rtc is False


def test_tip_follows_a_dot_moving_in_a_straight_line() -> None:
    policy = DotFollower(horizon=16, lookback=3)
    velocity = np.array([0.3, -0.15])  # world units per second
    start = np.array([0.8, 0.7])
    t = 50

    def dot(step: int) -> np.ndarray:
        return start + velocity * step / HZ

    q = np.array([*g.inverse(dot(t)), 0.25])
    rows = policy.infer(window(t, 3, dot(t - 3), dot(t), q))
    assert rows.shape == (16, 3) and rows.dtype == np.float64
    expected = np.array([dot(t + i) for i in range(16)])
    # Pixel rounding: ~half a pixel of position, so a velocity error growing with i.
    tolerance = PIXEL * (1.0 + np.arange(16) * 2 / 3)
    error = np.linalg.norm(tips(rows) - expected, axis=1)
    assert (error <= tolerance).all(), error
    assert (rows[:, 2] == 0.25).all()  # the gripper keeps its current value


def test_tip_follows_the_linear_prediction_of_the_lissajous_dot() -> None:
    policy = DotFollower(horizon=10, lookback=3)
    t = 77
    p0, p1 = g.target_at((t - 3) / HZ), g.target_at(t / HZ)
    q = np.array([*g.inverse(p1), 0.0])
    rows = policy.infer(window(t, 3, p0, p1, q))
    predicted = np.array([p1 + (p1 - p0) * i / 3 for i in range(10)])
    error = np.linalg.norm(tips(rows) - predicted, axis=1)
    assert (error <= PIXEL * (1.0 + np.arange(10) * 2 / 3)).all(), error
    assert np.linalg.norm(tips(rows)[0] - g.target_at(t / HZ)) < 2 * PIXEL


def test_branch_nearest_the_current_pose_is_kept() -> None:
    policy = DotFollower(horizon=5)
    p = np.array([1.0, 0.9])
    for elbow_up in (False, True):
        q = np.array([*g.inverse(p, elbow_up=elbow_up), 0.0])
        rows = policy.infer(window(10, 3, p, p, q))
        assert (np.sign(rows[:, 1]) == np.sign(q[1])).all()
        np.testing.assert_allclose(rows[0, :2], q[:2], atol=0.02)


def test_angles_stay_continuous_with_the_current_pose() -> None:
    policy = DotFollower(horizon=3)
    p = np.array([1.0, 0.5])
    base = g.inverse(p)
    q = np.array([base[0] + 2 * math.pi, base[1]])  # the same pose, one turn further
    rows = policy.infer(window(10, 3, p, p, q))
    np.testing.assert_allclose(rows[0], q, atol=0.02)


def test_single_step_plans_with_zero_velocity() -> None:
    policy = DotFollower(horizon=6)
    p = np.array([1.1, 0.4])
    q = np.array([0.0, -1.0, 0.5])
    rows = policy.infer({"observations": [{"top": frame(p), "joints.pos": q}], "steps": [0]})
    error = np.linalg.norm(tips(rows) - p, axis=1)
    assert (error < 2 * PIXEL).all()
    assert policy.infer({"top": frame(p), "joints.pos": q}).shape == (6, 3)  # bare observation


@pytest.mark.parametrize("which", ["then", "now"])
def test_missing_dot_in_one_frame_uses_the_other(which: str) -> None:
    policy = DotFollower(horizon=4)
    p = np.array([1.2, 0.3])
    q = np.array([*g.inverse(p + 0.1), 0.0])
    then, now = (None, p) if which == "then" else (p, None)
    rows = policy.infer(window(20, 3, then, now, q))
    error = np.linalg.norm(tips(rows) - p, axis=1)
    assert (error < 2 * PIXEL).all()


@pytest.mark.parametrize("bad", [None, "no dot", "chw"])
def test_no_dot_anywhere_holds_the_current_pose(bad: str | None) -> None:
    policy = DotFollower(horizon=4)
    q = np.array([0.3, -0.7, 1.0])
    img = {None: frame(None), "no dot": frame(None), "chw": np.zeros((3, 8, 8), np.float32)}[bad]
    rows = policy.infer(
        {"observations": [{"top": img}, {"top": img, "joints.pos": q}], "steps": [1, 4]}
    )
    np.testing.assert_array_equal(rows, np.tile(q, (4, 1)))


def test_other_frame_sizes_map_through_the_view() -> None:
    policy = DotFollower(horizon=2)
    p = np.array([0.9, 0.2])
    found = policy.find_dot(frame(p, w=320, h=240))
    assert found is not None and np.linalg.norm(found - p) < 2 * PIXEL * 2


def test_tolerance_finds_a_jpeg_compressed_dot() -> None:
    p = np.array([1.0, 0.6])
    ok, jpeg = cv2.imencode(".jpg", frame(p), [cv2.IMWRITE_JPEG_QUALITY, 80])
    assert ok
    decoded = cv2.imdecode(jpeg, cv2.IMREAD_UNCHANGED)
    found = DotFollower(colour_tolerance=40).find_dot(decoded)
    assert found is not None and np.linalg.norm(found - p) < 2 * PIXEL


def test_served_demo_answers_like_the_policy() -> None:
    """`serve` (in a thread here) hands the window over unchanged; `--arg` strings convert."""
    sockdir = Path(tempfile.mkdtemp(prefix="robotd-demo-"))  # ipc paths must stay short
    p0, p1 = np.array([1.0, 0.5]), np.array([1.02, 0.49])
    q = np.array([*g.inverse(p1), 0.1])
    inputs = window(10, 3, p0, p1, q)

    async def main(endpoint: str) -> None:
        client = PolicyClient(endpoint, timeout_s=10)
        hello = await client.connect()
        assert hello.observations == DotFollower.observations
        result = await client.act("demo", 10, inputs["steps"], inputs["observations"])
        np.testing.assert_allclose(result.actions, DotFollower(horizon=5).infer(inputs))
        await client.close()

    spec = ("robotd.demo:DotFollower", f"ipc://{sockdir}/w.sock")
    try:
        with serving(*spec, policy_kwargs={"horizon": "5"}) as endpoint:
            anyio.run(main, endpoint, backend_options={"use_uvloop": True})
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)


def test_letterboxed_jpeg_frames_as_declared_map_back_to_the_world() -> None:
    """The frame the robot fits and encodes for the declared camera (224 x 224, pad, JPEG)
    still places the dot where it is: the letterbox is undone, JPEG's colours tolerated."""
    from robotd.frames import decode, fit_and_encode, to_wire
    from robotd.worker.demo import CAMERA

    policy = DotFollower()
    for p in (np.array([1.0, 0.6]), np.array([0.45, 0.15]), np.array([1.35, 0.85])):
        enc = fit_and_encode(frame(p), CAMERA, name="top")
        assert enc.codec == "jpeg" and enc.nbytes() * 40 < W * H * 3  # vs a raw 640 x 480
        found = policy.find_dot(decode(to_wire(enc), name="top"))
        assert found is not None and np.linalg.norm(found - p) < 3 * PIXEL * W / 224


def _plan_and_prefix(offset: float, p: int = 4) -> tuple[np.ndarray, np.ndarray]:
    plan = np.stack([np.linspace(0, 1, 20), np.linspace(1, 0, 20), np.zeros(20)], axis=1)
    prefix = plan[:p] + np.array([offset, -offset / 2, 0.0])
    return plan, prefix


@pytest.mark.parametrize("offset", [0.0, 0.02, 0.1, 0.5])
def test_rtc_continues_the_prefix_and_blends_by_at_most_blend_step_a_row(offset: float) -> None:
    policy = DotFollower(rtc=True, blend_step=0.03)
    plan, prefix = _plan_and_prefix(offset)
    out = policy.continue_prefix(plan, prefix)
    assert np.array_equal(out[:4], prefix)  # the frozen rows, exactly
    extra = np.diff(out - plan, axis=0)[3:]  # what the blend adds to each step from the seam on
    assert (np.abs(extra) <= 0.03 + 1e-12).all()
    rows = math.ceil(offset / 0.03 - 1e-9) - 1 if offset else 0
    assert np.array_equal(out[4 + max(0, rows) :], plan[4 + max(0, rows) :])  # then its own plan


def test_rtc_is_used_only_when_asked_for() -> None:
    p0, p1 = np.array([1.0, 0.5]), np.array([1.02, 0.49])
    inputs = window(10, 3, p0, p1, np.array([*g.inverse(p1), 0.1]))
    plain_rows = DotFollower(horizon=8, rtc=False).infer(inputs)
    prefix = plain_rows[:3] + 0.2
    rtc = {"delay": 3, "prefix": prefix, "rest": np.zeros((0, 3))}
    plain = DotFollower(horizon=8, rtc=False)
    assert plain.actions.rtc is False
    np.testing.assert_array_equal(plain.infer(inputs, rtc=rtc), plain_rows)
    out = DotFollower(horizon=8, rtc=True).infer(inputs, rtc=rtc)
    assert np.array_equal(out[:3], prefix) and not np.array_equal(out, plain_rows)
    # No prefix: the robot holds where it is for the delay, then the answer blends into the
    # plan (tests/test_demo_shield.py); here the arm is on the dot, so the plan follows at once.
    empty = {"delay": 3, "prefix": np.zeros((0, 3)), "rest": np.zeros((0, 3))}
    out = DotFollower(horizon=8, rtc=True).infer(inputs, rtc=empty)
    pose = inputs["observations"][-1]["joints.pos"]
    np.testing.assert_array_equal(out[:3], np.tile(pose, (3, 1)))
    np.testing.assert_array_equal(out[3:], plain_rows[3:])


def test_served_rtc_demo_declares_rtc_and_is_handed_the_prefix() -> None:
    sockdir = Path(tempfile.mkdtemp(prefix="robotd-demo-"))
    p1 = np.array([1.02, 0.49])
    inputs = window(10, 3, p1, p1, np.array([*g.inverse(p1), 0.1]))
    prefix = np.full((2, 3), 0.25)
    rtc = {"delay": 2, "prefix": prefix, "rest": np.full((1, 3), 0.3)}

    async def main(endpoint: str) -> None:
        client = PolicyClient(endpoint, timeout_s=10)
        hello = await client.connect()
        assert hello.actions is not None and hello.actions.rtc is True
        result = await client.act("demo", 10, inputs["steps"], inputs["observations"], rtc=rtc)
        np.testing.assert_array_equal(result.actions[:2], prefix)
        await client.close()

    spec = ("robotd.demo:DotFollower", f"ipc://{sockdir}/w.sock")
    try:
        with serving(*spec, policy_kwargs={"horizon": "6", "rtc": "true"}) as endpoint:
            anyio.run(main, endpoint, backend_options={"use_uvloop": True})
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)


def _still_dot() -> dict:
    p0, p1 = np.array([1.0, 0.5]), np.array([1.02, 0.49])
    return window(10, 3, p0, p1, np.array([*g.inverse(p1), 0.1]))


def test_sampled_chunks_are_fresh_seeded_draws_of_the_set_rms() -> None:
    inputs = _still_dot()
    exact = DotFollower(horizon=30, rtc=False).infer(inputs)
    off = DotFollower(horizon=30, rtc=False, sample_noise=0.0, seed=5)
    np.testing.assert_array_equal(off.infer(inputs), exact)  # 0: the exact plan
    policy = DotFollower(horizon=30, rtc=False, sample_noise=0.02, seed=5)
    twin = DotFollower(horizon=30, rtc=False, sample_noise=0.02, seed=5)
    samples = [policy.infer(inputs) for _ in range(200)]
    assert all(np.array_equal(twin.infer(inputs), s) for s in samples[:3])  # seeded
    assert not np.array_equal(samples[0], samples[1])  # each act draws anew
    other = DotFollower(horizon=30, rtc=False, sample_noise=0.02, seed=6).infer(inputs)
    assert not np.array_equal(other, samples[0])
    deviation = np.stack(samples) - exact
    assert (deviation[:, :, 2] == 0).all()  # the gripper is not steered
    assert abs(float(np.sqrt(np.mean(deviation[:, :, :2] ** 2))) / 0.02 - 1) < 0.1
    # smooth: a row's deviation is its neighbour's give or take far less than the spread
    steps = np.abs(np.diff(deviation[:, :, :2], axis=1))
    assert float(np.sqrt(np.mean(steps**2))) < 0.02 / 5


def test_sampled_rtc_keeps_the_prefix_then_blends_into_its_own_sample() -> None:
    inputs = _still_dot()
    sample = DotFollower(horizon=30, rtc=False, sample_noise=0.02, seed=1).infer(inputs)
    prefix = sample[:3] + 0.2  # the previous chunk's rows, far off
    rtc = {"delay": 3, "prefix": prefix, "rest": np.zeros((0, 3))}
    out = DotFollower(horizon=30, rtc=True, sample_noise=0.02, seed=1).infer(inputs, rtc=rtc)
    assert np.array_equal(out[:3], prefix)
    assert (np.abs(np.diff(out[2:, :2] - sample[2:, :2], axis=0)) <= 0.03 + 1e-12).all()
    np.testing.assert_array_equal(out[10:], sample[10:])  # 0.2 gone at 0.03 a row


def test_samples_stay_within_the_joint_limits() -> None:
    inputs = _still_dot()
    exact = DotFollower(horizon=30, rtc=False).infer(inputs)
    lo, hi = exact.min(axis=0) - 0.01, exact.max(axis=0) + 0.01
    limits = {"lower": [*lo[:2], 0.0], "upper": [*hi[:2], 1.0]}
    policy = DotFollower(horizon=30, rtc=False, sample_noise=0.2, **limits)
    rows = np.stack([policy.infer(inputs) for _ in range(20)])
    assert (rows[:, :, :2] >= lo[:2]).all() and (rows[:, :, :2] <= hi[:2]).all()
    assert (rows[:, :, :2] == lo[:2]).any() and (rows[:, :, :2] == hi[:2]).any()
    prefix = np.tile(hi + 0.5, (3, 1))  # a prefix past the limits is still kept as it is
    rtc = {"delay": 3, "prefix": prefix, "rest": np.zeros((0, 3))}
    out = DotFollower(horizon=30, sample_noise=0.2, **limits).infer(inputs, rtc=rtc)
    assert np.array_equal(out[:3], prefix) and (out[3:, :2] <= hi[:2]).all()


def test_sample_noise_must_be_finite_and_not_negative() -> None:
    for bad in (-0.01, math.inf, math.nan):
        with pytest.raises(ValueError, match="sample_noise"):
            DotFollower(sample_noise=bad)
