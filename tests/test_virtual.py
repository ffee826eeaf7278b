"""The virtual-clock runner: reproducible realtime runs, holds, the watchdog, and no stale row
ever played in aligned realtime mode (rows encode the step they are meant for)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drivers.sim import geometry as g
from robotd.config import Config, config_from_dict, load_config
from robotd.contract import Actions, Observations, Stream
from robotd.demo import DotFollower
from robotd.virtual.runner import run_virtual

HZ = 30.0
WIDE = {"lower": [-1e6] * 3, "upper": [1e6] * 3}  # no limit near any encoded step


def bare_config(**control: Any) -> Config:
    """Three joints, no grippers, no cameras, no velocity limit: a row's value reaches the
    joints unchanged, so a played target can be read back as the step it encodes."""
    return config_from_dict(
        {
            "robot": {"start": "episode"},
            "control": {"hz": HZ, **control},
            "joints": {"driver": "sim", "names": ["a", "b", "c"], **WIDE},
        }
    )


class StepEncoder:
    """Row i of a chunk asked at step s is s + i in every dim: the step it is meant for."""

    observations = Observations(streams={"joints.pos": Stream()})

    def __init__(self, horizon: int = 8) -> None:
        self.horizon = horizon
        self.actions = Actions(open_loop_horizon=horizon)
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def infer(self, inputs: dict[str, Any]) -> np.ndarray:
        s = inputs["steps"][-1]
        return np.repeat((s + np.arange(self.horizon, dtype=float))[:, None], 3, axis=1)


class Failing:
    """A policy that never gives a usable answer."""

    def __init__(self, how: str) -> None:
        self.how = how

    def infer(self, inputs: dict[str, Any]) -> Any:
        if self.how == "raise":
            raise RuntimeError("no answer")
        return None if self.how == "none" else np.zeros((0, 3))


def realtime_demo(merge: str = "replace") -> Config:
    return load_config(None, ['control.timing="realtime"', f'control.merge="{merge}"'])


# ----------------------------------------------------------------------------- reproducibility
@pytest.mark.parametrize("merge", ["replace", "fade", "ensemble"])
def test_two_realtime_runs_with_the_same_seed_play_identical_rows(merge: str) -> None:
    cfg = realtime_demo(merge)
    runs = [run_virtual(cfg, DotFollower(), steps=120, latency_s=0.15, seed=7) for _ in range(2)]
    assert runs[0].counters["chunks"] > 5 and runs[0].counters["rows_dropped"] > 0
    assert np.array_equal(runs[0].played, runs[1].played)
    assert np.array_equal(runs[0].held, runs[1].held)
    assert runs[0].tracking_mean == runs[1].tracking_mean
    other = run_virtual(cfg, DotFollower(), steps=120, latency_s=0.15, seed=8)
    assert not np.array_equal(runs[0].played, other.played)  # the seed does reach the run


def test_sync_at_zero_latency_never_holds_and_latency_costs_nothing() -> None:
    cfg = load_config(None, ['control.timing="sync"'])
    zero = run_virtual(cfg, DotFollower(), steps=90, latency_s=0.0)
    assert zero.holds == 0 and zero.running.all() and zero.counters["chunks"] >= 90 // 8
    assert zero.tracking_mean < 0.05  # the demo does follow the dot
    slow = run_virtual(cfg, DotFollower(), steps=90, latency_s=0.4)  # the world waits
    assert np.array_equal(zero.played, slow.played)


def test_config_latency_is_used_when_none_is_given() -> None:
    cfg = bare_config(timing="realtime", refill_steps=4, latency_s=0.1)
    result = run_virtual(cfg, StepEncoder(horizon=12), steps=40)
    assert result.counters["ask_latency"]["steps"] == {"p50": 3, "p99": 3}
    assert result.counters["ask_latency"]["ms"]["p50"] == pytest.approx(100.0, rel=0.02)


# ----------------------------------------------------------------------------- holds, watchdog
@pytest.mark.parametrize("how", ["raise", "none", "empty"])
@pytest.mark.parametrize(("timing", "latency"), [("sync", 0.0), ("realtime", 0.2)])
def test_watchdog_ends_a_starved_episode_at_exactly_max_hold_steps(how, timing, latency) -> None:
    limit = 20
    cfg = bare_config(timing=timing, max_hold_steps=limit)
    result = run_virtual(cfg, Failing(how), steps=60, latency_s=latency)
    assert result.outcome == "starved"
    assert result.running.sum() == limit and result.running[:limit].all()
    assert result.held[:limit].all() and result.holds == limit
    c = result.counters
    assert c["starved_episodes"] == 1 and c["max_consecutive_holds"] == limit
    assert c["act_failures"] >= 1 and c["chunks"] == 0
    # the robot keeps holding where it was after the episode ended
    assert np.all(result.played[limit:] == result.played[0])


# ----------------------------------------------------------------------------- no stale row
@pytest.mark.parametrize("latency", [0.0, 0.03, 0.05, 0.1, 0.2])
@pytest.mark.parametrize("merge", ["replace", "fade", "ensemble"])
def test_aligned_realtime_never_plays_a_row_meant_for_another_step(latency, merge) -> None:
    # refill_steps 8 covers the longest latency here (6 steps): the queue never runs dry
    cfg = bare_config(timing="realtime", refill_steps=8, merge=merge, fade_steps=3)
    result = run_virtual(cfg, StepEncoder(horizon=16), steps=90, latency_s=latency)
    delay = math.ceil(latency * HZ - 1e-9)
    ticks = np.arange(90)
    played = ~result.held & result.running
    # fade bends the first rows of a chunk towards the last played row: skip its seams
    exact = played if merge != "fade" else played & (result.played[:, 0] == ticks)
    assert exact.sum() > 45
    # a stale row is a whole step off; ensemble's weighted mean of equal values may be 1 ulp
    assert np.abs(result.played[exact] - ticks[exact, None]).max() < 1e-9
    assert not result.held[delay:].any() and result.held[:delay].all()  # ticks ran meanwhile
    assert result.counters["stale_rows_played"] == 0
    if delay:
        assert result.counters["merge_dropped"] >= delay * result.counters["chunks"]


def test_fade_rows_are_meant_for_their_step_up_to_the_blend() -> None:
    cfg = bare_config(timing="realtime", refill_steps=4, merge="fade", fade_steps=3)
    result = run_virtual(cfg, StepEncoder(horizon=12), steps=90, latency_s=0.1)
    ticks = np.arange(90, dtype=float)
    off = result.played[:, 0] - ticks
    # a seam lands 1/3 of the way from the last played row (one step back) onto the new
    # chunk's row for this very step, then 2/3: never a whole step behind
    # (the first chunk fades in from where the robot held, so look from its fade on)
    assert np.all(off[6:] > -1.0) and np.all(off[6:] <= 0.0)


def test_naive_realtime_plays_late_rows_and_the_counter_sees_them() -> None:
    cfg = bare_config(timing="realtime", refill_steps=4)
    result = run_virtual(cfg, StepEncoder(horizon=12), steps=60, latency_s=0.1, aligned=False)
    played = ~result.held & result.running
    lag = np.arange(60)[played] - result.played[played, 0]
    assert (lag == 3).sum() > 40 and lag.min() >= 0  # 3 ticks late, the act's latency
    assert result.counters["stale_rows_played"] == (lag > 0).sum()


def test_a_chunk_wholly_in_the_past_is_discarded_and_counted() -> None:
    cfg = bare_config(timing="realtime", refill_steps=2, max_hold_steps=1000)
    result = run_virtual(cfg, StepEncoder(horizon=4), steps=40, latency_s=0.2)  # 6 > 4 rows
    c = result.counters
    assert c["chunks"] >= 5 and c["stale_chunks"] == c["chunks"]
    assert result.held.all() and c["stale_rows_played"] == 0


# ----------------------------------------------------------------------------- cameras
class DotSeer:
    """Reads the top camera alone and keeps where it saw the dot, by step."""

    observations = Observations(streams={"top": Stream()})

    def __init__(self) -> None:
        self.finder = DotFollower()
        self.seen: dict[int, np.ndarray] = {}

    def infer(self, inputs: dict[str, Any]) -> np.ndarray:
        step = inputs["steps"][-1]
        self.seen[step] = self.finder.find_dot(inputs["observations"][-1]["top"])
        return np.array([[1.0, -1.5, 0.0]])


def test_a_camera_shows_the_frame_of_its_newest_capture_time() -> None:
    cfg = load_config(
        None,
        [
            'control.timing="sync"',
            "cameras.top.fps=10",
            "joints.lower=[-3.0, -3.0, 0.0]",
            "joints.upper=[3.0, 3.0, 1.0]",
        ],
    )
    policy = DotSeer()
    run_virtual(cfg, policy, steps=30, latency_s=0.0)
    assert sorted(policy.seen) == list(range(30))
    closer = 0
    for step, found in policy.seen.items():
        captured = math.floor(step / 3) / 10  # 10 fps under a 30 Hz loop
        assert np.linalg.norm(found - g.target_at(captured)) < 0.005
        closer += np.linalg.norm(found - g.target_at(step / HZ)) > 0.008
    assert closer >= 15  # between captures the picture really is the older one


def test_bad_arguments_are_named() -> None:
    cfg = bare_config()
    with pytest.raises(ValueError, match="steps"):
        run_virtual(cfg, StepEncoder(), steps=0, latency_s=0.0)
    with pytest.raises(ValueError, match="latency_s"):
        run_virtual(cfg, StepEncoder(), steps=5, latency_s=-1.0)
    with pytest.raises(TypeError, match="infer"):
        run_virtual(cfg, object(), steps=5, latency_s=0.0)


# ----------------------------------------------------------------------------- properties


@settings(max_examples=12, deadline=None)
@given(
    latency_ms=st.integers(0, 300),
    refill=st.integers(0, 10),
    merge=st.sampled_from(["replace", "fade", "ensemble"]),
    seed=st.integers(0, 3),
)
def test_any_realtime_run_is_reproducible_bit_for_bit(latency_ms, refill, merge, seed) -> None:
    cfg = load_config(
        None,
        ['control.timing="realtime"', f'control.merge="{merge}"', f"control.refill_steps={refill}"],
    )
    runs = [
        run_virtual(cfg, DotFollower(horizon=16), steps=45, latency_s=latency_ms / 1e3, seed=seed)
        for _ in range(2)
    ]
    assert np.array_equal(runs[0].played, runs[1].played, equal_nan=True)
    assert np.array_equal(runs[0].held, runs[1].held)


@settings(max_examples=25, deadline=None)
@given(
    latency_steps=st.integers(0, 12),
    horizon=st.integers(1, 12),
    refill=st.integers(0, 8),
    limit=st.integers(1, 30),
)
def test_the_kernel_watchdog_ends_a_starving_episode_at_exactly_max_hold_steps(
    latency_steps, horizon, refill, limit
) -> None:
    cfg = bare_config(timing="realtime", refill_steps=refill, max_hold_steps=limit)
    result = run_virtual(cfg, StepEncoder(horizon=horizon), steps=80, latency_s=latency_steps / HZ)
    run = result.held & result.running
    longest, current = 0, 0
    for h in run:
        current = current + 1 if h else 0
        longest = max(longest, current)
    assert longest <= limit
    assert (result.outcome == "starved") == (longest == limit)
    assert result.counters["max_consecutive_holds"] == longest
