"""The safety shield: clip within tolerance, reject beyond, rate limits, bad actions."""

from __future__ import annotations

import numpy as np
import pytest

from robotd.control.shield import CLAMPED, CLIPPED, OK, REJECTED, Shield


def make(**kw) -> Shield:
    args = dict(clip_tolerance=0.05, dt=0.01, reject_run=3)
    args.update(kw)
    s = Shield(["a", "b"], np.array([-1.0, -1.0]), np.array([1.0, 1.0]), **args)
    s.reset(np.zeros(2))
    return s


def test_within_limits_passes_unchanged():
    s = make()
    v = s.check(np.array([0.5, -0.5]))
    assert v.outcome == OK and np.array_equal(v.target, [0.5, -0.5])


def test_clip_within_tolerance_is_counted():
    s = make()
    v = s.check(np.array([1.03, 0.0]))
    assert v.outcome == CLIPPED and v.target[0] == 1.0
    assert s.counters.clipped == 1


def test_beyond_tolerance_rejected_and_holds_last():
    s = make()
    s.check(np.array([0.2, 0.2]))
    v = s.check(np.array([1.2, 0.0]))
    assert v.outcome == REJECTED and "a target 1.2000 outside" in v.reason
    assert np.array_equal(v.target, [0.2, 0.2])


def test_run_of_rejections_asks_for_fault_and_a_pass_resets_it():
    s = make()
    assert not s.check(np.array([np.nan, 0.0])).fault
    assert not s.check(np.array([5.0, 0.0])).fault
    s.check(np.array([0.0, 0.0]))
    assert not s.check(np.array([5.0, 0.0])).fault
    assert not s.check(np.array([5.0, 0.0])).fault
    assert s.check(np.array([5.0, 0.0])).fault


@pytest.mark.parametrize(
    "action, words",
    [
        (np.array([np.inf, 0.0]), "non-finite action for a"),
        (np.array([0.0, 0.0, 0.0]), "shape (3,)"),
        (np.array([0, 0]), "float array"),
        ([0.0, 0.0], "float array, got list"),
    ],
)
def test_bad_actions_rejected_with_a_clear_reason(action, words):
    v = make().check(action)
    assert v.outcome == REJECTED and words in v.reason


def test_velocity_limit_clamps_each_tick():
    s = make(max_velocity=np.array([1.0, 1.0]))  # 0.01 per tick at dt=0.01
    v = s.check(np.array([0.5, -0.005]))
    assert v.outcome == CLAMPED
    assert v.target == pytest.approx([0.01, -0.005])


def test_acceleration_limit():
    s = make(max_acceleration=np.array([100.0, 100.0]))  # Δstep ≤ 0.01 per tick
    v1 = s.check(np.array([0.5, 0.0]))
    assert v1.target[0] == pytest.approx(0.01)
    v2 = s.check(np.array([0.5, 0.0]))
    assert v2.target[0] == pytest.approx(0.03)


def test_hold_is_last_target():
    s = make()
    s.check(np.array([0.3, 0.1]))
    assert np.array_equal(s.hold(), [0.3, 0.1])
