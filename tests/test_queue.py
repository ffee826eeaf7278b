"""Action queue merging/playing rules (merge modes, timings), the hold action and the hold watchdog.

The property tests simulate a control loop: ticks t = 0..N, chunks of random lengths computed
from random past steps arriving at random ticks (merged before that tick's pop), and some ticks
whose pop is skipped (an overrun). Rows encode the step they are meant for, so a played row can
be checked against the tick that played it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robotd.control.queue import ActionQueue, QueueConfig
from robotd.control.watchdog import Watchdog

# one tick: the chunks arriving before its pop, as (lag = t - s, length), and whether it pops
TICK = st.tuples(
    st.lists(st.tuples(st.integers(0, 10), st.integers(1, 12)), max_size=2),
    st.integers(0, 5).map(lambda k: k > 0),
)
SCHEDULE = st.lists(TICK, min_size=1, max_size=60)


@dataclass
class Sent:
    ident: int
    s: int
    height: int
    merged_at: int
    rows: np.ndarray


def encoded_chunk(ident: int, s: int, height: int) -> np.ndarray:
    """dim 0: the step the row is meant for; dim 1: the chunk's id; dim 2: the row index."""
    i = np.arange(height, dtype=float)
    return np.stack([s + i, np.full(height, float(ident)), i], axis=1)


# ----------------------------------------------------------------------------- realtime replace
@settings(max_examples=150, deadline=None)
@given(SCHEDULE, st.integers(0, 6))
def test_realtime_replace_plays_only_the_current_steps_row(schedule, refill) -> None:
    q = ActionQueue(QueueConfig(dim=3, timing="realtime", refill_steps=refill))
    newest: Sent | None = None
    kept = played = ident = 0
    for t, (arrivals, pops) in enumerate(schedule):
        for lag, height in arrivals:
            s = max(0, t - lag)
            before = q.peek().copy()
            chunks, stale = q.counters.chunks, q.counters.stale_chunks
            res = q.merge(encoded_chunk(ident, s, height), s, t)
            assert q.counters.chunks == chunks + 1
            if t - s >= height:  # wholly in the past: discarded, counted, queue unchanged
                assert res.stale and res.dropped == height
                assert q.counters.stale_chunks == stale + 1
                assert np.array_equal(q.peek(), before)
            else:  # the queue is exactly this chunk's aligned rows
                assert not res.stale and res.dropped == res.played_from == t - s
                assert np.array_equal(q.peek(), encoded_chunk(ident, s, height)[t - s :])
                assert q.front_step == t
                newest = Sent(ident, s, height, t, np.empty(0))
                kept += height - (t - s)
            ident += 1
        assert q.should_ask(in_flight=True) is False
        assert q.should_ask(in_flight=False) == (len(q) <= refill)
        if not pops:
            continue
        row = q.pop(t)
        expect_row = newest is not None and t < newest.s + newest.height
        assert (row is not None) == expect_row
        if row is not None:
            assert row[0] == t  # never a row for a past (or future) step
            assert row[1] == newest.ident
            assert np.array_equal(q.last_played, row)
            played += 1
    c = q.counters
    assert kept == played + c.rows_dropped + c.replaced_rows + len(q)


def test_stale_chunk_leaves_queue_and_counts() -> None:
    q = ActionQueue(QueueConfig(dim=3, timing="realtime"))
    q.merge(encoded_chunk(0, 0, 8), 0, 0)
    assert q.pop(0)[0] == 0
    res = q.merge(encoded_chunk(1, 0, 3), 0, 3)  # rows for steps 0..2, arriving at step 3
    assert (res.dropped, res.stale, res.played_from) == (3, True, 3)
    assert q.counters.stale_chunks == 1 and q.counters.chunks == 2
    assert len(q) == 7 and q.front_step == 1
    assert q.pop(3)[0] == 3  # steps 1 and 2 were never played: dropped, not played late
    assert q.counters.rows_dropped == 2


def test_aligned_merge_drops_past_rows() -> None:
    q = ActionQueue(QueueConfig(dim=3, timing="realtime"))
    res = q.merge(encoded_chunk(0, 10, 6), 10, 13)
    assert (res.dropped, res.stale, res.played_from) == (3, False, 3)
    assert [q.pop(t)[0] for t in (13, 14, 15)] == [13, 14, 15]
    assert q.pop(16) is None
    assert q.counters.merge_dropped == 3


# ----------------------------------------------------------------------------- sync and naive
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.one_of(st.none(), st.integers(1, 12)), st.integers(0, 5))
def test_sync_truncates_to_open_loop_horizon_and_drops_nothing(height, horizon, waited) -> None:
    q = ActionQueue(QueueConfig(dim=3, timing="sync", open_loop_horizon=horizon))
    assert q.should_ask(in_flight=False) and not q.should_ask(in_flight=True)
    s = 7
    res = q.merge(encoded_chunk(0, s, height), s, s + waited)  # the world waited: no drop
    assert (res.dropped, res.stale, res.played_from) == (0, False, 0)
    n = height if horizon is None else min(height, horizon)
    assert len(q) == n
    assert not q.should_ask(in_flight=False)
    # rows play in order, one per tick, whatever step they were meant for
    got = [q.pop(s + waited + k)[2] for k in range(n)]
    assert got == list(range(n))
    assert q.pop(s + waited + n) is None
    assert q.should_ask(in_flight=False)
    assert q.counters.rows_dropped == 0


def test_naive_plays_from_chunk_start() -> None:
    q = ActionQueue(QueueConfig(dim=3, timing="realtime", aligned=False, refill_steps=2))
    res = q.merge(encoded_chunk(0, 0, 5), 0, 4)  # computed at 0, arrives at 4
    assert (res.dropped, res.stale, res.played_from) == (0, False, 0)
    assert [q.pop(t)[0] for t in (4, 5)] == [0, 1]  # played late, by design of the baseline
    assert not q.should_ask(in_flight=False)  # 3 left > refill 2
    assert q.pop(6)[0] == 2
    assert q.should_ask(in_flight=False) and not q.should_ask(in_flight=True)
    q.merge(encoded_chunk(1, 2, 2), 2, 9)  # nothing is ever stale in naive mode
    assert [q.pop(t)[1] for t in (9, 10)] == [1, 1]
    assert q.pop(11) is None


# ----------------------------------------------------------------------------- fade
@settings(max_examples=150, deadline=None)
@given(
    fade=st.integers(1, 8),
    first_len=st.integers(2, 10),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_fade_blends_the_seam_linearly(fade, first_len, data, seed) -> None:
    rng = np.random.default_rng(seed)
    grip = (2,)
    q = ActionQueue(
        QueueConfig(dim=4, timing="realtime", merge="fade", fade_steps=fade, grippers=grip)
    )
    first = rng.normal(size=(first_len, 4)) * 10
    q.merge(first, 0, 0)
    k = data.draw(st.integers(1, first_len - 1), label="rows played of the first chunk")
    for t in range(k):  # nothing played before: the first chunk plays unchanged
        assert np.array_equal(q.pop(t), first[t])
    last = q.last_played.copy()
    lag = data.draw(st.integers(0, 4), label="lag")
    second = rng.normal(size=(lag + data.draw(st.integers(1, 12)), 4)) * 10
    q.merge(second, k - lag, k)
    fresh = second[lag:]
    offset = last - fresh[0]
    offset[list(grip)] = 0.0
    for j in range(fresh.shape[0]):
        row = q.pop(k + j)
        weight = max(0.0, 1.0 - (j + 1) / fade)
        np.testing.assert_allclose(row, fresh[j] + weight * offset, rtol=0, atol=1e-9)
        assert row[2] == fresh[j, 2]  # the gripper jumps straight to the new value
        if j >= fade - 1:
            assert np.array_equal(row, fresh[j])  # the chunk's own rows, unchanged
        if j == 0:  # stated bound: the first row lands exactly |offset| / fade_steps away
            np.testing.assert_allclose(
                np.abs(row - last)[[0, 1, 3]], np.abs(offset[[0, 1, 3]]) / fade, atol=1e-9
            )
    assert q.pop(k + fresh.shape[0]) is None


def test_fade_forgets_the_seam_on_flush_unless_kept() -> None:
    cfg = QueueConfig(dim=2, timing="realtime", merge="fade", fade_steps=4)
    q = ActionQueue(cfg)
    q.merge(np.zeros((3, 2)), 0, 0)
    q.pop(0)
    assert q.flush() == 2 and q.counters.flushed_rows == 2
    assert q.last_played is None
    q.merge(np.ones((3, 2)), 0, 0)  # no seam: plays unchanged
    assert np.array_equal(q.pop(0), [1.0, 1.0])
    q.flush(keep_seam=True)
    q.merge(np.full((3, 2), 5.0), 0, 0)  # seam kept: 1 -> 5 blended over 4 rows
    np.testing.assert_allclose(q.pop(0), [2.0, 2.0])


# ----------------------------------------------------------------------------- ensemble
@settings(max_examples=150, deadline=None)
@given(SCHEDULE, st.floats(0.0, 2.0), st.integers(0, 2**32 - 1))
def test_ensemble_plays_weighted_mean_of_covering_chunks(schedule, decay, seed) -> None:
    rng = np.random.default_rng(seed)
    q = ActionQueue(
        QueueConfig(dim=3, timing="realtime", merge="ensemble", ensemble_decay=decay, grippers=(1,))
    )
    sent: list[Sent] = []
    for t, (arrivals, pops) in enumerate(schedule):
        for lag, height in arrivals:
            s = max(0, t - lag)
            rows = rng.normal(size=(height, 3))
            q.merge(rows, s, t)
            sent.append(Sent(len(sent), s, height, t, rows))
        if not pops:
            continue
        row = q.pop(t)
        covering = [c for c in sent if c.merged_at <= t and c.s <= t < c.s + c.height]
        assert (row is None) == (not covering)
        if row is None:
            continue
        weights = np.exp(-decay * np.arange(len(covering)))  # i = 0: the oldest chunk
        values = np.stack([c.rows[t - c.s] for c in covering])
        mean = weights @ values / weights.sum()
        np.testing.assert_allclose(row[[0, 2]], mean[[0, 2]], rtol=1e-9, atol=1e-12)
        assert row[1] == covering[-1].rows[t - covering[-1].s, 1]  # gripper: newest chunk


def test_ensemble_two_chunks_documented_mean() -> None:
    q = ActionQueue(
        QueueConfig(dim=2, timing="realtime", merge="ensemble", ensemble_decay=0.5, grippers=(1,))
    )
    q.merge(np.array([[0.0, 0.0], [2.0, 0.0], [4.0, 0.0]]), 0, 0)
    assert np.array_equal(q.pop(0), [0.0, 0.0])
    q.merge(np.array([[10.0, 1.0], [20.0, 1.0], [30.0, 1.0], [40.0, 1.0]]), 0, 1)
    w = math.exp(-0.5)
    np.testing.assert_allclose(q.pop(1), [(2.0 + w * 20.0) / (1 + w), 1.0])
    np.testing.assert_allclose(q.pop(2), [(4.0 + w * 30.0) / (1 + w), 1.0])
    np.testing.assert_allclose(q.pop(3), [40.0, 1.0])  # only the newest chunk covers step 3
    assert q.pop(4) is None


# ----------------------------------------------------------------------------- queue misc
def test_pop_discards_late_rows_and_flush_empties() -> None:
    q = ActionQueue(QueueConfig(dim=3, timing="realtime", refill_steps=3))
    q.merge(encoded_chunk(0, 0, 10), 0, 0)
    assert q.pop(4)[0] == 4  # steps 0..3 passed unplayed
    assert q.counters.rows_dropped == 4
    assert not q.should_ask(in_flight=False)
    assert q.pop(9)[0] == 9
    assert q.should_ask(in_flight=False)
    q.merge(encoded_chunk(1, 10, 5), 10, 10)
    assert q.flush() == 5 and len(q) == 0 and q.counters.flushed_rows == 5
    assert q.pop(0) is None  # steps count from 0 again after a flush


def test_bad_inputs_raise_clear_errors() -> None:
    q = ActionQueue(QueueConfig(dim=3, timing="realtime"))
    with pytest.raises(ValueError, match=r"shape \(4, 2\), expected \(H >= 1, 3\)"):
        q.merge(np.zeros((4, 2)), 0, 0)
    with pytest.raises(ValueError, match="shape"):
        q.merge(np.zeros((0, 3)), 0, 0)
    with pytest.raises(ValueError, match="non-finite value at row 1, dim 2"):
        q.merge(np.array([[0, 0, 0], [0, 0, np.nan]]), 0, 0)
    with pytest.raises(ValueError, match="not numeric"):
        q.merge([["a", "b", "c"]], 0, 0)
    with pytest.raises(ValueError, match="from_step 5 is after now_step 2"):
        q.merge(np.zeros((4, 3)), 5, 2)
    with pytest.raises(TypeError, match="now_step must be an integer"):
        q.merge(np.zeros((4, 3)), 0, 1.5)
    assert q.counters.chunks == 0 and len(q) == 0  # nothing changed
    q.merge(np.zeros((4, 3)), 0, 0)
    q.pop(2)
    with pytest.raises(ValueError, match="step 2 was already played"):
        q.pop(2)
    with pytest.raises(ValueError, match="went backwards"):
        q.pop(1)
    with pytest.raises(ValueError, match="needs now_step 3"):
        q.merge(np.zeros((4, 3)), 0, 2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"dim": 0}, "dim"),
        ({"dim": 2, "timing": "async"}, "timing"),
        ({"dim": 2, "open_loop_horizon": 0}, "open_loop_horizon"),
        ({"dim": 2, "refill_steps": -1}, "refill_steps"),
        ({"dim": 2, "merge": "mean"}, "merge"),
        ({"dim": 2, "timing": "realtime", "merge": "fade", "fade_steps": 0}, "fade_steps"),
        ({"dim": 2, "ensemble_decay": float("nan")}, "ensemble_decay"),
        ({"dim": 2, "grippers": (2,)}, "grippers"),
        ({"dim": 2, "grippers": (1, 1)}, "grippers"),
        ({"dim": 2, "merge": "fade"}, "merge"),  # sync cannot fade
        ({"dim": 2, "timing": "realtime", "aligned": False, "merge": "ensemble"}, "merge"),
    ],
)
def test_config_validation_names_the_field(kwargs, field) -> None:
    with pytest.raises(ValueError, match=rf"QueueConfig\.{field}:"):
        QueueConfig(**kwargs)


# ----------------------------------------------------------------------------- watchdog
@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.lists(st.booleans(), max_size=40))
def test_watchdog_trips_exactly_at_max_hold_steps(limit, ticks) -> None:
    w = Watchdog(limit)
    run = longest = 0
    for held in ticks:
        if held:
            run += 1
            longest = max(longest, run)
            assert w.held() == (run == limit)
        else:
            run = 0
            w.played()
        assert w.consecutive == run and w.tripped == (run >= limit)
    assert w.max_consecutive == longest and w.holds == sum(ticks)
    w.reset()
    assert (w.consecutive, w.max_consecutive, w.holds) == (0, 0, 0)


def test_watchdog_resets_on_played_row() -> None:
    w = Watchdog(3)
    assert [w.held(), w.held()] == [False, False]
    w.played()
    assert [w.held(), w.held(), w.held(), w.held()] == [False, False, True, False]
    with pytest.raises(ValueError, match="max_hold_steps must be >= 1"):
        Watchdog(0)


def test_fade_starts_from_what_was_commanded_not_the_row_popped() -> None:
    q = ActionQueue(QueueConfig(dim=1, timing="realtime", merge="fade", fade_steps=4))
    q.merge(np.array([[0.0], [1.0], [2.0]]), 0, 0)
    q.pop(0)
    q.commanded(np.array([0.5]))  # the shield clamped the robot short of the row
    q.merge(np.array([[10.0], [11.0], [12.0], [13.0], [14.0]]), 1, 1)
    first = q.pop(1)
    # offset 0.5 - 10 = -9.5 fades over 4 rows: row 0 keeps 3/4 of it
    assert first[0] == pytest.approx(10.0 - 9.5 * 0.75)
