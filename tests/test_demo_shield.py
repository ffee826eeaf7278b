"""The demo policy on the sim robot never needs the shield: the joints it does not steer
hold a value within their stops (not each act's noisy reading of a joint resting at one),
and its first chunk joins the arm where it rests instead of jumping to the dot.

Found on the wall clock (`robotd run --config config/sim.toml --duration 5 --summary`):
15 to 114 shield interventions in 5 s whatever the host's load, nearly all the gripper,
at its 0.0 stop, commanded at its read-noise reading (σ 0.5 mrad) and clipped on every row
of about half the chunks; plus 1 to 4 rate clamps as the first chunk jumped from the pose
the arm rested at to the dot. The virtual clock shows the same spread, by noise seed alone.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from drivers.sim import geometry as g
from robotd.config import load_config
from robotd.demo import DotFollower
from robotd.virtual.runner import run_virtual
from robotd.worker.episode import Episode

HZ = 30.0
# The arm rests where the dot was a second before the episode began (on the wall clock it
# rests where the dot was when the world started, seconds before the daemon is up).
REST = [*g.inverse(g.target_at(-1.0)).tolist(), 0.0]


def _shield(result: object) -> dict[str, int]:
    c = result.counters  # type: ignore[attr-defined]
    return {k: c[k] for k in ("clipped", "clamped", "rejected")}


@pytest.mark.parametrize("latency_s", [0.0, 0.1])
@pytest.mark.parametrize("seed", range(6))
def test_the_sim_demo_never_trips_the_shield(seed: int, latency_s: float) -> None:
    """config/sim.toml as shipped (read noise on, the gripper at its 0.0 stop): without the
    fix, seeds 1, 2, 3 and 5 had 13 to 123 of 150 ticks clipped."""
    cfg = load_config(None)
    result = run_virtual(cfg, DotFollower(), steps=150, latency_s=latency_s, seed=seed)
    assert _shield(result) == {"clipped": 0, "clamped": 0, "rejected": 0}
    gripper = result.played[result.running, 2]
    assert (gripper == gripper[0]).all() and 0.0 <= gripper[0] <= 1.0  # held, not walked
    assert result.tracking_mean < 0.06  # it still follows the dot


@pytest.mark.parametrize("latency_s", [0.0, 0.05, 0.1])
def test_the_first_chunk_joins_the_arm_where_it_rests(latency_s: float) -> None:
    """The arm rests away from the dot when the episode begins: the demo blends towards it
    by at most blend_step a row on top of its plan's own motion, well within the velocity
    bound (without the fix: the first chunk jumped, and the shield clamped it)."""
    cfg = load_config(None, [f"joints.options.initial={REST}"])
    start = np.array(REST[:2])
    assert np.abs(g.inverse(g.target_at(0.0)) - start).max() > 4.0 / HZ  # a real jump
    result = run_virtual(cfg, DotFollower(), steps=90, latency_s=latency_s, seed=1)
    assert _shield(result) == {"clipped": 0, "clamped": 0, "rejected": 0}
    assert result.max_jump < 4.0 / HZ
    if latency_s == 0.0:  # the answer on time: blend_step + the dot path's ~0.023 rad a step
        assert result.max_jump < 0.03 + 0.03


def test_unsteered_joints_hold_the_first_reading_of_the_episode_within_their_stops() -> None:
    policy = DotFollower(horizon=4)
    frame = np.full((48, 64, 3), g.BACKGROUND, np.uint8)  # no dot: the plan holds the pose

    def act(episode: Episode, gripper: float) -> np.ndarray:
        q = np.array([0.9, -1.2, gripper])
        return policy.infer({"observations": [{"top": frame, "joints.pos": q}], "steps": [0]},
                            episode=episode)

    first = Episode("e-1")
    for reading in (-0.0004, 0.0003, -0.0002):  # read noise around the 0.0 stop
        assert (act(first, reading)[:, 2] == 0.0).all()
    second = Episode("e-2")
    assert (act(second, 0.25)[:, 2] == 0.25).all()
    assert (act(second, 0.2504)[:, 2] == 0.25).all()
    assert (act(Episode("e-3"), 1.0003)[:, 2] == 1.0).all()  # the upper stop too


def test_given_limits_hold_the_unsteered_joints_within_them() -> None:
    policy = DotFollower(horizon=3, lower=[-2.8, -2.8, -1.0], upper=[2.8, 2.8, 1.0])
    frame = np.full((48, 64, 3), g.BACKGROUND, np.uint8)
    q = np.array([0.5, -1.0, -0.5])
    rows = policy.infer({"observations": [{"top": frame, "joints.pos": q}], "steps": [0]})
    np.testing.assert_array_equal(rows[:, 2], -0.5)  # not pulled to the sim arm's 0..1
    with pytest.raises(ValueError, match="lower/upper hold 3 values"):
        policy.infer({"observations": [{"top": frame, "joints.pos": q[:2]}], "steps": [0]})
    for bad in ({"lower": [0.0]}, {"lower": [1.0], "upper": [0.0]}, {"lower": [], "upper": []}):
        with pytest.raises(ValueError, match="DotFollower: lower"):
            DotFollower(**bad)  # type: ignore[arg-type]


def _plan() -> np.ndarray:
    return np.stack([np.linspace(0, 1, 20), np.linspace(1, 0, 20), np.zeros(20)], axis=1)


@pytest.mark.parametrize("offset", [0.02, 0.1, 0.5])
def test_with_no_prefix_the_answer_holds_the_pose_for_the_delay_then_blends(offset: float) -> None:
    policy = DotFollower(blend_step=0.03)
    plan = _plan()
    pose = plan[0] + np.array([offset, -offset / 2, 0.0])
    out = policy.continue_prefix(plan, np.zeros((0, 3)), delay=3, pose=pose)
    np.testing.assert_array_equal(out[:3], np.tile(pose, (3, 1)))  # the robot holds there
    extra = np.diff(out - plan, axis=0)[2:]  # what the blend adds to each step from there
    assert (np.abs(extra) <= 0.03 + 1e-12).all()
    seam = np.abs(pose - plan[2]).max()
    rows = max(0, math.ceil(seam / 0.03 - 1e-9) - 1)
    np.testing.assert_array_equal(out[3 + rows :], plan[3 + rows :])
    np.testing.assert_array_equal(policy.continue_prefix(plan, np.zeros((0, 3))), plan)


def test_a_short_prefix_is_held_at_its_last_row_until_the_delay() -> None:
    policy = DotFollower(blend_step=0.03)
    plan = _plan()
    prefix = plan[:2] + 0.2
    out = policy.continue_prefix(plan, prefix, delay=5, pose=plan[0])
    np.testing.assert_array_equal(out[:2], prefix)
    np.testing.assert_array_equal(out[2:5], np.tile(prefix[-1], (3, 1)))
    assert (np.abs(np.diff(out - plan, axis=0)[4:]) <= 0.03 + 1e-12).all()
