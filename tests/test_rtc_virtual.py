"""Real-time chunking on the virtual clock, over random latency schedules (hypothesis): the
prefix handed to the policy is exactly what then plays at those steps, no row meant for a
past step is ever played, auto refill never runs dry after the first chunk when the latency
allows it, and delay_overruns counts exactly the acts later than their predicted delay."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from robotd.config import Config, config_from_dict
from robotd.contract import Actions, Observations, Stream
from robotd.virtual.latency import jittered, listed
from robotd.virtual.runner import VirtualResult, run_virtual

HZ = 30.0
STEPS = 150


def config(refill: int | str, merge: str) -> Config:
    """Three joints, the last a gripper (never blended: it carries the step a row is meant
    for), limits far away and no velocity limit, so a played target is the row itself."""
    return config_from_dict(
        {
            "robot": {"start": "episode"},
            "control": {
                "hz": HZ,
                "timing": "realtime",
                "refill_steps": refill,
                "merge": merge,
                "max_hold_steps": 10_000,
            },
            "joints": {
                "driver": "sim",
                "names": ["a", "b", "grip"],
                "grippers": ["grip"],
                "lower": [-1e7] * 3,
                "upper": [1e7] * 3,
            },
        }
    )


class Recorder:
    """Takes the frozen prefix (infer names `rtc`) and records it, but answers rows of its
    own for those steps too: dim 0 tells the act apart, the gripper the step a row is for."""

    observations = Observations(streams={"joints.pos": Stream()})

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        self.actions = Actions(open_loop_horizon=horizon)
        self.handed: list[tuple[int, int, np.ndarray]] = []  # (step, delay, prefix)

    def infer(self, inputs: dict[str, Any], *, rtc: dict[str, Any] | None = None) -> np.ndarray:
        s = inputs["steps"][-1]
        assert rtc is not None  # every realtime act carries it
        self.handed.append((s, rtc["delay"], np.array(rtc["prefix"])))
        i = np.arange(self.horizon, dtype=float)
        act = float(len(self.handed))
        return np.stack([1000.0 * act + i, -(s + i) - 0.5, s + i], axis=1)


class Plain(Recorder):
    """The same rows, from a policy that takes no rtc (it is handed none)."""

    def infer(self, inputs: dict[str, Any]) -> np.ndarray:  # type: ignore[override]
        return super().infer(inputs, rtc={"delay": 1, "prefix": np.zeros((0, 3))})


def played(result: VirtualResult) -> dict[int, np.ndarray]:
    """Step -> the row played there (held steps left out); one episode per run here."""
    assert {rec.wep for rec in result.steps} == {"virtual-1"}
    return {rec.s: np.array(rec.target) for rec in result.steps if not rec.held}


LATENCIES = st.lists(st.integers(0, 14), min_size=1, max_size=40)  # per act, in steps
REFILL = st.one_of(st.just("auto"), st.integers(0, 10))
MERGE = st.sampled_from(["replace", "fade", "ensemble"])


@settings(max_examples=60, deadline=None)
@given(LATENCIES, REFILL, MERGE, st.integers(2, 24))
def test_the_prefix_handed_is_what_plays_and_no_past_row_ever_plays(
    latencies: list[int], refill: int | str, merge: str, horizon: int
) -> None:
    policy = Recorder(horizon)
    result = run_virtual(
        config(refill, merge), policy, steps=STEPS, latency_s=listed([k / HZ for k in latencies])
    )
    rows = played(result)
    assert result.counters["acts"] == len(policy.handed) >= 1
    for s, delay, prefix in policy.handed:
        assert prefix.shape[0] <= delay
        for i, row in enumerate(prefix):
            if s + i < STEPS:
                assert s + i in rows, f"step {s + i} of the prefix asked at {s} was held"
                assert np.array_equal(rows[s + i], row)  # bit for bit
    for step, row in rows.items():
        assert row[2] == step  # every row played was meant for the step that played it
    assert result.counters["stale_rows_played"] == 0


@settings(max_examples=60, deadline=None)
@given(LATENCIES, REFILL, MERGE, st.integers(2, 24))
def test_delay_overruns_count_exactly_the_acts_later_than_predicted(
    latencies: list[int], refill: int | str, merge: str, horizon: int
) -> None:
    policy = Recorder(horizon)
    result = run_virtual(
        config(refill, merge), policy, steps=STEPS, latency_s=listed([k / HZ for k in latencies])
    )
    late = merged = 0
    for n, (s, delay, _) in enumerate(policy.handed):
        took = latencies[min(n, len(latencies) - 1)]
        if s + took < STEPS:  # its answer merged within the run
            merged += 1
            late += took > delay
    assert result.counters["delay_overruns"] == late
    assert len(result.merges) == merged


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 30), st.data(), MERGE, st.booleans())
def test_auto_refill_never_runs_dry_after_the_first_chunk(
    horizon: int, data: st.DataObject, merge: str, rtc: bool
) -> None:
    """One act is in flight at a time, so a chunk must outlast the next act: a constant
    latency of at most half the horizon (in steps) is one that auto refill can cover."""
    latency = data.draw(st.integers(0, horizon // 2), label="latency steps")
    policy = (Recorder if rtc else Plain)(horizon)
    result = run_virtual(config("auto", merge), policy, steps=STEPS, latency_s=latency / HZ)
    assert result.counters["chunks"] >= 2
    assert result.holds_after_first == 0
    assert result.holds == latency  # the first chunk's wait, nothing else
    assert result.counters["delay_overruns"] == (1 if latency > 1 else 0)  # the first act


def test_a_latency_beyond_half_the_horizon_does_run_dry() -> None:
    """The bound above is tight: the check could fail."""
    result = run_virtual(config("auto", "replace"), Recorder(10), steps=STEPS, latency_s=6 / HZ)
    assert result.holds_after_first > 0


def test_jittered_schedules_are_reproducible_and_within_their_spread() -> None:
    a, b, other = jittered(0.2, 0.5, seed=3), jittered(0.2, 0.5, seed=3), jittered(0.2, 0.5, 4)
    values = [a(n) for n in range(200)]
    assert values == [b(n) for n in range(200)] and values != [other(n) for n in range(200)]
    assert min(values) >= 0.1 and max(values) <= 0.3 and np.std(values) > 0.04
    cfg = config("auto", "replace")
    runs = [
        run_virtual(cfg, Recorder(16), steps=STEPS, latency_s=jittered(0.2, 0.5, seed=3))
        for _ in range(2)
    ]
    assert np.array_equal(runs[0].played, runs[1].played)
    assert runs[0].counters["delay_overruns"] >= 1
    took = {m.at - m.from_step for m in runs[0].merges}
    assert len(took) > 2 and all(math.ceil(0.1 * HZ) <= t <= math.ceil(0.3 * HZ) for t in took)
