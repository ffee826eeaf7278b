"""Real-time chunking, piece by piece: the delay prediction, frozen rows in the queue's merge,
the frozen prefix each realtime ask carries, its conversion to a policy's own rate, and the
refill warning for "auto"."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robotd.config import load_config
from robotd.contract import MAX_RTC_ROWS, Actions
from robotd.control.delay import DelayPredictor
from robotd.control.kernel import Kernel
from robotd.control.playback import Chunk
from robotd.control.queue import ActionQueue, QueueConfig
from robotd.lane.messages import Merged, Rows, Rtc
from robotd.link.rtc import RtcRefused, rtc_request
from robotd.runtime.events import EventLog
from tests.lane_util import plain
from tests.test_kernel import DT_NS
from tests.test_queue import encoded_chunk


# ----------------------------------------------------------------------------- the prediction
def test_prediction_is_a_quantile_of_recent_delays_and_never_below_one() -> None:
    p = DelayPredictor(quantile=0.9, margin=1, window=10)
    assert (p.predict(), p.refill(), p.measured) == (1, 2, 0)  # nothing measured yet
    p.add(0)
    assert (p.predict(), p.refill()) == (1, 2)  # a delay of 0 steps still predicts 1
    for d in (5, 5, 5, 5, 5, 5, 5, 5, 9):
        p.add(d)
    assert p.predict() == 5  # the 9th of 10 (nearest rank 0.9): one slow act is the tail
    p.add(9)
    assert (p.predict(), p.refill()) == (9, 10)
    for _ in range(10):  # the window forgets
        p.add(3)
    assert (p.predict(), p.measured) == (3, 10)
    top = DelayPredictor(quantile=1.0, margin=0)
    for d in (2, 7, 3):
        top.add(d)
    assert (top.predict(), top.refill()) == (7, 7)


def test_one_act_that_took_minutes_still_leaves_an_ask_the_lane_can_send() -> None:
    """A first act that took 2.5 min at 30 Hz (a server back after an outage) is 4500 steps:
    the prediction stops at the lane's bound, so the next Ask still crosses to the main
    process instead of being refused there, which would leave the act in flight for good."""
    from robotd.lane import codec
    from robotd.lane.messages import MAX_ROWS, Ask

    p = DelayPredictor()
    p.add(4500)
    assert p.predict() == MAX_ROWS and p.refill() == MAX_ROWS + 1
    ask = Ask(2, "w", 4500, 1, 0, Rtc(p.predict(), None, None))
    (back,) = codec.decode_up_batch(codec.encode_batch([ask]))
    assert back == ask


@settings(max_examples=200, deadline=None)
@given(
    delays=st.lists(st.integers(-3, 40), max_size=120),
    quantile=st.floats(0.01, 1.0),
    window=st.integers(1, 40),
)
def test_the_kept_order_predicts_as_sorting_the_window_would(
    delays: list[int], quantile: float, window: int
) -> None:
    """The predictor keeps its window sorted as delays come and go; that must give the very
    nearest-rank quantile that sorting the last `window` delays afresh gives."""
    import math

    p = DelayPredictor(quantile=quantile, margin=0, window=window)
    for i, d in enumerate(delays):
        p.add(d)
        ranked = sorted(max(0, x) for x in delays[max(0, i + 1 - window) : i + 1])
        rank = max(1, math.ceil(quantile * len(ranked) - 1e-9))
        assert p.predict() == max(1, ranked[rank - 1])
        assert p.measured == len(ranked)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"quantile": 0}, "quantile"), ({"quantile": 1.5}, "quantile"), ({"margin": -1}, "margin")],
)
def test_prediction_arguments_are_checked(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        DelayPredictor(**kwargs)


def test_refill_and_delay_keys_are_validated_naming_the_key() -> None:
    from robotd.errors import ConfigError

    assert load_config(None, []).control.refill_steps == "auto"
    assert load_config(None, ["control.refill_steps=3"]).control.refill_steps == 3
    for bad in ('"soon"', "-1", "2.5", "true"):
        with pytest.raises(ConfigError, match=r"control\.refill_steps: must be 'auto' or an int"):
            load_config(None, [f"control.refill_steps={bad}"])
    with pytest.raises(ConfigError, match=r"control\.delay_quantile: must be <= 1"):
        load_config(None, ["control.delay_quantile=1.5"])
    with pytest.raises(ConfigError, match=r"control\.delay_margin_steps: must be >= 0"):
        load_config(None, ["control.delay_margin_steps=-1"])


# ----------------------------------------------------------------------------- frozen rows
MODES = st.sampled_from(["replace", "fade", "ensemble"])


@settings(max_examples=150, deadline=None)
@given(
    MODES,
    st.lists(st.tuples(st.integers(0, 8), st.integers(1, 12), st.integers(0, 8)), max_size=25),
)
def test_merge_never_changes_a_row_before_keep_before(mode: str, chunks: list) -> None:
    """Chunks from random past steps with random freezes: the queued rows for steps before
    the freeze stay bit for bit; the rest is the chunk's (blended as the mode says); and a row
    popped is always meant for the step that pops it (dim 0)."""
    q = ActionQueue(QueueConfig(dim=3, timing="realtime", merge=mode, grippers=(0,)))
    for t, (lag, height, freeze) in enumerate(chunks):
        ident = t
        s = max(0, t - lag)
        before = q.ahead(t).copy()
        keep = min(freeze, before.shape[0])
        res = q.merge(encoded_chunk(ident, s, height), s, t, keep_before=t + freeze)
        after = q.ahead(t)
        if res.stale:
            assert np.array_equal(after, before)
        else:
            assert np.array_equal(after[:keep], before[:keep])  # bit for bit
            assert q.front_step == t
            fresh = encoded_chunk(ident, s, height)[t + keep - s :]
            n = fresh.shape[0]
            if mode == "ensemble":  # the older rows past the chunk's end stay queued
                assert after.shape[0] == max(before.shape[0], keep + n)
            else:
                assert after.shape[0] == keep + n
            assert np.array_equal(after[keep : keep + n, 0], fresh[:, 0])  # grippers: unblended
        row = q.pop(t)
        if row is not None:
            assert row[0] == t


def test_fade_after_frozen_rows_starts_from_the_last_of_them() -> None:
    q = ActionQueue(QueueConfig(dim=1, timing="realtime", merge="fade", fade_steps=2))
    q.merge(np.array([[0.0], [1.0], [2.0], [3.0]]), 0, 0)
    q.pop(0)
    q.merge(np.array([[10.0], [11.0], [12.0], [13.0]]), 1, 1, keep_before=3)  # 1, 2 frozen
    played = [q.pop(t)[0] for t in (1, 2, 3, 4)]
    # the seam is after the frozen 2.0: offset 2 - 12 = -10, half of it left on row 12
    assert played == [1.0, 2.0, 7.0, 13.0]
    assert q.pop(5) is None


def test_an_answer_with_rows_only_for_frozen_steps_is_stale_and_the_queue_keeps_its_rows() -> None:
    """A policy whose horizon is shorter than the frozen prefix gives nothing to merge: the
    rows queued after the prefix (the old chunk's rest) must still play, not be discarded."""
    q = ActionQueue(QueueConfig(dim=1, timing="realtime"))
    q.merge(np.arange(10.0)[:, None], 0, 0)  # rows for steps 0..9
    q.pop(0)
    q.pop(1)
    res = q.merge(np.full((3, 1), 50.0), 1, 2, keep_before=6)  # rows for steps 1..3: 2, 3 frozen
    assert res.stale and q.counters.stale_chunks == 1
    np.testing.assert_array_equal(q.ahead(2)[:, 0], np.arange(2.0, 10.0))


def test_rows_for_skipped_steps_do_not_count_as_left() -> None:
    """After steps were skipped (an overrun), the rows meant for them will never play: the
    ask comes when the rows left for the coming step reach refill_steps, not a tick late."""
    q = ActionQueue(QueueConfig(dim=1, timing="realtime", refill_steps=6))
    q.merge(np.arange(12.0)[:, None], 0, 0)  # rows for steps 0..11
    for t in range(5):
        q.pop(t)
    assert len(q) == 7 and q.left(5) == 7 and not q.should_ask(False, step=5)
    assert q.left(7) == 5 and q.should_ask(False, step=7)  # steps 5, 6 skipped
    assert q.left(20) == 0


def test_a_seam_to_fade_after_kept_frozen_rows_fades_from_the_last_of_them() -> None:
    """fade_seam in a replace merge that keeps frozen rows (an earlier act's): the blend
    starts from the last frozen row, as fade's does; without it the chunk replaces at once."""
    played = {}
    for fade_seam in (False, True):
        q = ActionQueue(QueueConfig(dim=1, timing="realtime", fade_steps=2))
        q.merge(np.array([[0.0], [1.0], [2.0], [3.0]]), 0, 0)
        q.pop(0)
        rows = np.array([[10.0], [11.0], [12.0], [13.0]])
        q.merge(rows, 1, 1, keep_before=3, fade_seam=fade_seam)
        played[fade_seam] = [q.pop(t)[0] for t in (1, 2, 3, 4)]
    assert played[False] == [1.0, 2.0, 12.0, 13.0]
    assert played[True] == [1.0, 2.0, 7.0, 13.0]  # offset 2 - 12, half of it left on row 12


def test_should_ask_with_auto_needs_the_callers_threshold() -> None:
    q = ActionQueue(QueueConfig(dim=1, timing="realtime", refill_steps="auto"))
    q.merge(np.zeros((3, 1)), 0, 0)
    assert q.should_ask(False, refill=3) and not q.should_ask(False, refill=2)
    with pytest.raises(ValueError, match="auto"):
        q.should_ask(False)


# ----------------------------------------------------------------------------- the lane's ask
class Lane:
    """A realtime kernel driven tick by tick (no cameras), recording what it emits."""

    def __init__(self, *overrides: str, rtc: bool = True) -> None:
        cfg = load_config(None, ['control.timing="realtime"', "cameras={}", *overrides])
        self.out: list = []
        self.k = Kernel(cfg, run_id="t", emit=self.out.append)
        self.k.set_contract(None, rtc=rtc)
        self.t = 0

    def tick(self) -> np.ndarray | None:
        from drivers.base import JointState

        self.t += DT_NS
        js = JointState(np.zeros(3), np.zeros(3), np.zeros(3), self.t)
        return self.k.update(self.t, js, {})

    def asks(self) -> list:
        return [m for m in self.out if type(m).__name__ == "Ask"]

    def answer(self, rows: np.ndarray) -> None:
        ask = self.asks()[-1]
        self.k.deliver(Chunk(ask.id, ask.wep, ask.s, rows))


def ramp(s: int, n: int, tag: float) -> np.ndarray:
    """Rows meant for steps s..s+n-1: (step, tag, 0) — the step on a joint, not the gripper."""
    return np.stack([s + np.arange(n, dtype=float), np.full(n, tag), np.zeros(n)], axis=1) / 100


def test_each_realtime_ask_carries_the_delay_and_the_frozen_prefix() -> None:
    lane = Lane("control.refill_steps=6", "control.delay_margin_steps=0")
    lane.tick()  # step 0: the first ask, nothing queued, delay 1 (nothing measured)
    (first,) = lane.asks()
    assert first.rtc == Rtc(1, None, None)
    lane.tick()
    lane.tick()
    lane.answer(ramp(0, 10, 1.0))  # merged at step 3: took 3 steps
    lane.tick()
    assert lane.k.counters.delay_overruns == 1  # predicted 1, took 3
    merged = [m for m in lane.out if isinstance(m, Merged)]
    assert merged[-1].refill == 6  # a fixed refill_steps is what the uplink is told
    for _ in range(2):
        lane.tick()  # steps 4, 5 ... the ask comes when 6 rows remain (steps 4..9)
    ask = lane.asks()[-1]
    assert ask.s == 4 and ask.rtc is not None and ask.rtc.delay == 3
    prefix, rest = ask.rtc.prefix.array(), ask.rtc.rest.array()
    np.testing.assert_array_equal(prefix, ramp(4, 3, 1.0))  # steps 4, 5, 6: frozen
    np.testing.assert_array_equal(rest, ramp(7, 3, 1.0))  # steps 7, 8, 9: the rest
    lane.answer(ramp(4, 10, 2.0))  # merged at step 6, early: step 6 stays the prefix's
    played = [lane.tick().copy() for _ in range(4)]  # steps 6..9
    assert [round(p[1] * 100) for p in played] == [1, 2, 2, 2]
    assert np.allclose([p[0] * 100 for p in played], [6, 7, 8, 9])
    assert lane.k.counters.delay_overruns == 1


def _late_answer(
    rtc: bool, late_by: int, *overrides: str
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Asked at step 4 with a delay of 3 (prefix: steps 4, 5, 6), answered at 7 + late_by:
    (the last target played before the answer, the targets played from then on)."""
    lane = Lane("control.refill_steps=6", "control.delay_margin_steps=0",
                "control.fade_steps=5", *overrides, rtc=rtc)  # fmt: skip
    for _ in range(3):
        lane.tick()
    lane.answer(ramp(0, 10, 1.0))  # merged at step 3: took 3, so the next act predicts 3
    played = [lane.tick().copy() for _ in range(4 + late_by)]  # steps 3 .. 6 + late_by
    ask = lane.asks()[-1]
    assert ask.s == 4 and ask.rtc is not None and ask.rtc.delay == 3
    lane.answer(ramp(4, 20, 2.0))
    return played[-1], [lane.tick().copy() for _ in range(5)]


def test_an_rtc_answer_on_time_plays_as_the_policy_continued_the_prefix() -> None:
    last, after = _late_answer(rtc=True, late_by=0)  # merged at step 7, right after the prefix
    assert round(last[1] * 100) == 1  # step 6: the prefix's last row
    np.testing.assert_allclose(np.stack(after), ramp(7, 5, 2.0))  # the answer's own rows


def test_an_rtc_answer_later_than_its_prefix_is_faded_in_from_the_last_row_played() -> None:
    """Its policy continued the prefix's last row (step 6); the robot has since played the
    rest of the queue (steps 7, 8), so the seam is where the robot is: faded as merge="fade"
    does, over fade_steps, and the gripper (the last joint) is never blended."""
    last, after = _late_answer(rtc=True, late_by=2)  # merged at step 9
    assert np.allclose(last, ramp(8, 1, 1.0)[0])  # step 8: the old chunk's rest played
    new = ramp(9, 5, 2.0)
    offset = np.where([True, True, False], last - new[0], 0.0)
    weights = np.array([0.8, 0.6, 0.4, 0.2, 0.0])
    np.testing.assert_allclose(np.stack(after), new + weights[:, None] * offset)
    assert abs(after[0][1] - last[1]) == pytest.approx(abs(offset[1]) / 5)


def test_a_late_rtc_answer_of_deltas_is_not_faded() -> None:
    """A delta is not a position: blending it toward the last one played would move the
    robot where the policy did not ask."""
    last, after = _late_answer(True, 2, 'control.control_mode="delta"')
    moved = np.diff(np.stack([last, *after]), axis=0)
    np.testing.assert_allclose(moved[:, :2], ramp(9, 5, 2.0)[:, :2])  # the answer's deltas


def test_a_late_answer_without_an_rtc_contract_replaces_at_once() -> None:
    _, after = _late_answer(rtc=False, late_by=2)
    np.testing.assert_allclose(np.stack(after), ramp(9, 5, 2.0))  # replace: no fade


def test_rows_still_frozen_for_an_earlier_act_are_in_the_next_acts_prefix() -> None:
    """Act A is handed steps 5..9 and answers at once; act B, asked at 6 with a predicted
    delay of 1, is handed steps 6..9 as its prefix (delay 4): they play whatever B answers,
    so telling B they were its rest would have had it plan a seam that never comes."""
    lane = Lane("control.refill_steps=100", "control.delay_quantile=0.5")
    for _ in range(5):
        lane.tick()  # steps 0..4: the first ask, then holds
    lane.answer(ramp(0, 40, 0.0))
    lane.tick()  # step 5: merged (took 5), act A asked with delay 5
    a = lane.asks()[-1]
    assert (a.s, a.rtc.delay, a.rtc.prefix.n) == (5, 5, 5)
    lane.answer(ramp(5, 40, 1.0))
    lane.tick()  # step 6: A merged (took 1: the median of 5 and 1 is 1), act B asked
    b = lane.asks()[-1]
    assert b.s == 6 and b.rtc.delay == 4
    np.testing.assert_array_equal(b.rtc.prefix.array(), ramp(6, 4, 0.0))  # A's frozen rows
    lane.answer(ramp(6, 40, 2.0))
    played = [round(lane.tick()[1] * 100) for _ in range(6)]  # steps 7..12
    assert played == [0, 0, 0, 2, 2, 2]  # the frozen rows, then B's own from step 10


def test_without_an_rtc_contract_the_answer_replaces_the_prefix_as_before() -> None:
    lane = Lane("control.refill_steps=6", rtc=False)
    for _ in range(3):
        lane.tick()
    lane.answer(ramp(0, 10, 1.0))
    for _ in range(3):
        lane.tick()  # steps 3, 4, 5: asked at 4 with 6 left (steps 4..9)
    ask = lane.asks()[-1]
    assert ask.rtc is not None and ask.rtc.prefix is not None  # still told, not promised
    lane.answer(ramp(4, 10, 2.0))
    played = lane.tick().copy()  # step 6: the new chunk's own row
    assert round(played[1] * 100) == 2 and round(played[0] * 100) == 6


def test_sync_and_naive_acts_carry_no_rtc() -> None:
    for overrides in (['control.timing="sync"'], ["control.aligned=false"]):
        lane = Lane(*overrides)
        lane.tick()
        assert lane.asks()[-1].rtc is None


def test_auto_refill_asks_at_the_predicted_delay_plus_margin() -> None:
    lane = Lane()  # refill "auto", margin 1
    lane.tick()
    for _ in range(3):
        lane.tick()
    lane.answer(ramp(0, 20, 1.0))  # took 4 steps
    asked_at = None
    for _ in range(20):
        lane.tick()
        if len(lane.asks()) == 2 and asked_at is None:
            asked_at = lane.k.step - 1
            assert plain(lane.asks()[-1])["queue"] == 5  # 4 + 1 rows left
    assert asked_at == 15  # rows for steps 15..19 were left


# ----------------------------------------------------------------------------- the policy's rate
def rows_of(a: np.ndarray) -> Rows:
    return Rows.of(a)


def test_rtc_request_at_the_control_rate_is_the_lane_rows() -> None:
    prefix, rest = np.arange(9.0).reshape(3, 3), np.ones((2, 3))
    got = rtc_request(Rtc(4, rows_of(prefix), rows_of(rest)), Actions(hz=30), 30.0, 3)
    assert got is not None and got["delay"] == 4
    np.testing.assert_array_equal(got["prefix"], prefix)
    np.testing.assert_array_equal(got["rest"], rest)
    empty = rtc_request(Rtc(2), None, 30.0, 3)
    assert empty is not None and empty["prefix"].shape == (0, 3) == empty["rest"].shape
    assert rtc_request(None, None, 30.0, 3) is None


def test_rtc_request_is_resampled_to_the_policys_rate() -> None:
    t = np.arange(12) / 30.0  # 12 control rows at 30 Hz: a ramp in time
    rows = np.stack([t, 2 * t], axis=1)
    got = rtc_request(Rtc(6, rows_of(rows[:6]), rows_of(rows[6:])), Actions(hz=15), 30.0, 2)
    assert got is not None and got["delay"] == 3  # 6 steps at 30 Hz are 3 rows at 15 Hz
    both = np.concatenate([got["prefix"], got["rest"]])
    np.testing.assert_allclose(both[:, 0], np.arange(both.shape[0]) / 15.0)
    assert got["prefix"].shape[0] == 3  # rows at 0, 1/15, 2/15 s fall within the prefix


@pytest.mark.parametrize("hz", [60.0, 45.0, 20.0])
def test_a_faster_or_slower_policy_is_told_frozen_rows_from_the_prefix_alone(hz: float) -> None:
    """A policy row timed after the prefix's last step, but before the next, is frozen: it
    plays the prefix's last row (what the robot commands until the next step), never a mix
    with the rest, which is not promised; with or without a rest it is the same prefix."""
    prefix, rest = np.array([[0.0], [1.0], [2.0]]), np.array([[10.0], [11.0]])
    told = [
        rtc_request(Rtc(3, rows_of(prefix), r), Actions(hz=hz), 30.0, 1)
        for r in (rows_of(rest), None)
    ]
    assert told[0] is not None and told[1] is not None
    np.testing.assert_array_equal(told[0]["prefix"], told[1]["prefix"])
    times = np.arange(told[0]["prefix"].shape[0]) / hz
    assert told[0]["prefix"].shape[0] == math.ceil(3 * hz / 30.0 - 1e-9)  # times in [0, 0.1)
    np.testing.assert_allclose(told[0]["prefix"][:, 0], np.minimum(times * 30.0, 2.0))
    assert told[0]["rest"].shape[0] >= 1 and told[0]["rest"][0, 0] > 2.0


def test_rtc_request_at_a_faster_policy_rate_stays_within_the_workers_bounds() -> None:
    """2100 control steps are 4200 rows at twice the rate: the worker takes at most
    MAX_RTC_ROWS, so the delay and the rows are bounded here rather than every act refused."""
    from robotd.worker.requests import rtc_value

    rows = rows_of(np.zeros((2100, 2)))
    got = rtc_request(Rtc(2100, rows, rows_of(np.zeros((2500, 2)))), Actions(hz=60), 30.0, 2)
    assert got is not None and got["delay"] == MAX_RTC_ROWS
    assert got["prefix"].shape[0] <= MAX_RTC_ROWS and got["rest"].shape[0] == MAX_RTC_ROWS
    rtc_value(got)  # the worker's own check: accepted


def test_rtc_request_refuses_rows_of_another_robot() -> None:
    with pytest.raises(RtcRefused, match="this robot has 3"):
        rtc_request(Rtc(2, rows_of(np.zeros((1, 2)))), None, 30.0, 3)
    with pytest.raises(RtcRefused, match="for a delay of 1"):
        rtc_request(Rtc(1, rows_of(np.zeros((2, 3)))), None, 30.0, 3)
    bad = Rows(2, 3, b"\x00" * 8)
    with pytest.raises(RtcRefused, match=r"rtc\.rest"):
        rtc_request(Rtc(2, None, bad), None, 30.0, 3)


# ----------------------------------------------------------------------------- the warning
class _Summary:
    def __init__(self, p50: int) -> None:
        self.p50 = p50

    def ask_latency(self) -> dict:
        return {"count": 9, "steps": {"p50": self.p50, "p99": self.p50}, "ms": {"p50": 1.0}}


@pytest.mark.parametrize(
    ("refill", "p50", "rows", "warned"),
    [("auto", 5, 16, False), ("auto", 9, 16, True), (4, 5, 100, True), (8, 5, 10, False)],
)
def test_refill_warning(caplog, refill, p50: int, rows: int, warned: bool) -> None:
    control = load_config(
        None, ['control.timing="realtime"', f"control.refill_steps={refill!r}".replace("'", '"')]
    ).control
    events = EventLog(control, _Summary(p50), lambda wep: None)  # type: ignore[arg-type]
    events.on_merged(Merged(1, "w", 0, p50, rows, p50, False))
    with caplog.at_level(logging.WARNING, logger="robotd"):
        events.check_refill()
        events.check_refill()  # once only
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == (1 if warned else 0), said
    if warned and refill == "auto":
        assert f"at least {2 * p50} rows" in said[0]


def test_a_contract_arriving_with_an_act_in_flight_abandons_the_act() -> None:
    """After a reconnect the new contract can reach the lane while an act asked just before
    runs: the rows its prefix froze are flushed, so its answer must not be merged as if
    they had played; it is discarded and the lane asks anew."""
    lane = Lane("control.refill_steps=6", "control.delay_margin_steps=0")
    for _ in range(3):
        lane.tick()
    lane.answer(ramp(0, 10, 1.0))
    for _ in range(3):
        lane.tick()  # merged at 3; act A asked at step 4 with prefix steps 4, 5, 6
    a = lane.asks()[-1]
    assert a.s == 4 and a.rtc.prefix.n == 3
    lane.k.set_contract(None, rtc=True)
    assert lane.k.playback.in_flight is None and len(lane.k.playback.queue) == 0
    assert any(getattr(m, "name", "") == "act_abandoned" for m in lane.out)
    lane.k.deliver(Chunk(a.id, a.wep, a.s, ramp(4, 10, 2.0)))
    holds = lane.k.counters.holds
    held = lane.tick()  # step 6: A's answer discarded, a new act asked, the robot holds
    assert lane.k.counters.holds == holds + 1 and round(held[0] * 100) == 5  # at step 5's row
    assert lane.k.counters.late_chunks == 1 and lane.k.counters.chunks == 1
    b = lane.asks()[-1]
    assert b.id != a.id and b.s == 6 and b.rtc.prefix is None  # nothing queued to freeze
    lane.answer(ramp(6, 10, 3.0))
    row = lane.tick()  # step 7: B's own row
    assert row is not None and round(row[1] * 100) == 3
