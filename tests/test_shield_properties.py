"""Property tests: whatever goes in and whatever (valid) limits are set, no target that
leaves the shield is NaN, out of its limits, or over the velocity or acceleration bound."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from robotd.control.shield import Shield, braking_step

wild = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.floats(-1e3, 1e3),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324]),
)


@st.composite
def configs(draw):
    n = draw(st.integers(1, 4))
    lower = np.array(draw(st.lists(st.floats(-10, 10), min_size=n, max_size=n)))
    width = np.array(draw(st.lists(st.floats(1e-3, 20), min_size=n, max_size=n)))
    dt = draw(st.floats(1e-4, 0.1))
    vel = draw(st.none() | st.lists(st.floats(1e-3, 100), min_size=n, max_size=n))
    acc = draw(st.none() | st.lists(st.floats(1e-1, 1e4), min_size=n, max_size=n))
    return dict(
        names=[f"j{i}" for i in range(n)],
        lower=lower,
        upper=lower + width,
        clip_tolerance=draw(st.floats(0, 1)),
        dt=dt,
        max_velocity=None if vel is None else np.array(vel),
        max_acceleration=None if acc is None else np.array(acc),
        reject_run=draw(st.integers(1, 10)),
    )


def _op(n: int):
    row = st.lists(wild, min_size=n, max_size=n).map(lambda v: np.array(v, dtype=np.float64))
    near = st.lists(st.floats(-30, 30), min_size=n, max_size=n).map(np.array)
    bad = st.sampled_from(
        [np.zeros(n + 1), np.zeros(n, dtype=np.int64), [0.0] * n, None, np.zeros((n, 1))]
    )
    return st.one_of(
        st.tuples(st.just("check"), row),
        st.tuples(st.just("check"), near),
        st.tuples(st.just("check"), bad),
        st.tuples(st.just("hold"), st.none()),
    )


def _run(data: st.DataObject) -> tuple[dict, int, np.ndarray, list]:
    """A shield's config, its joint count, a start pose and the ticks' operations."""
    cfg = data.draw(configs())
    n = len(cfg["names"])
    start = np.array(data.draw(st.lists(st.floats(-30, 30), min_size=n, max_size=n)))
    return cfg, n, start, data.draw(st.lists(_op(n), min_size=1, max_size=60))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_no_target_is_nan_out_of_limits_or_over_the_bounds(data):
    cfg, n, start, ops = _run(data)
    shield = Shield(**cfg)
    shield.reset(start)
    lo, hi = cfg["lower"], cfg["upper"]
    vmax = None if cfg["max_velocity"] is None else cfg["max_velocity"] * cfg["dt"]
    amax = None if cfg["max_acceleration"] is None else cfg["max_acceleration"] * cfg["dt"] ** 2
    prev = shield.last.copy()
    prev_step = np.zeros(n)
    for kind, value in ops:
        out = shield.check(value).target if kind == "check" else shield.hold()
        assert out.shape == (n,) and out.dtype == np.float64
        assert np.isfinite(out).all(), out
        assert ((out >= lo) & (out <= hi)).all(), (out, lo, hi)
        step = out - prev
        slack = 1e-12 + 1e-9 * np.abs(prev)
        if vmax is not None:
            assert (np.abs(step) <= vmax * (1 + 1e-9) + slack).all(), (step, vmax)
        if amax is not None:
            assert (np.abs(step - prev_step) <= amax * (1 + 1e-9) + slack).all(), (
                step,
                prev_step,
                amax,
            )
        prev, prev_step = out.copy(), step


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_fast_path_decides_exactly_as_the_full_check(data):
    cfg, _n, start, ops = _run(data)
    fast, full = Shield(**cfg), Shield(**cfg)
    full._fast = None  # every target through the numpy path
    fast.reset(start)
    full.reset(start)
    for kind, value in ops:
        if kind == "hold":
            a, b = fast.hold(), full.hold()
            assert a.tolist() == b.tolist()
            continue
        va, vb = fast.check(value), full.check(value)
        assert (va.outcome, va.reason, va.fault) == (vb.outcome, vb.reason, vb.fault)
        assert va.target.dtype == vb.target.dtype == np.float64
        assert va.target.tolist() == vb.target.tolist()  # bit for bit (as floats)
    assert fast.counters == full.counters


def braking_distance(v: float, dstep: float) -> float:
    """How far a joint moving `v` per tick goes while braking by `dstep` per tick to rest:
    v + (v - d) + ... over the n = ceil(v / d) ticks the speed stays > 0 (closed form, so
    a tiny deceleration costs no million-step loop)."""
    if v <= 0:
        return 0.0
    n = math.ceil(v / dstep)
    return n * v - dstep * n * (n - 1) / 2


@settings(deadline=None)
@given(
    room=st.floats(0, 1e3),
    dstep=st.floats(1e-9, 10),
)
def test_braking_step_stops_within_the_room(room, dstep):
    v = float(braking_step(np.array([room]), np.array([dstep]))[0])
    assert braking_distance(v, dstep) <= room * (1 + 1e-9) + 1e-9
    # ... and it is the largest such step: a little faster would overrun
    if room > 0 and room / dstep < 1e5:
        assert braking_distance(v * (1 + 1e-6) + 1e-12, dstep) > room


def test_a_hold_with_an_acceleration_bound_is_a_controlled_stop():
    s = Shield(
        ["a"],
        np.array([-1.0]),
        np.array([1.0]),
        clip_tolerance=0.0,
        dt=0.01,
        max_velocity=np.array([1.0]),
        max_acceleration=np.array([10.0]),  # 0.001 per tick²
    )
    s.reset(np.zeros(1))
    for _ in range(20):
        s.check(np.array([1.0]))
    steps, last = [], s.last.copy()
    for _ in range(30):
        now = s.hold().copy()
        steps.append(float(now[0] - last[0]))
        last = now
    assert steps[0] > 0 and steps[-1] == 0.0  # slowed down, then still
    assert all(b <= a for a, b in itertools.pairwise(steps))
