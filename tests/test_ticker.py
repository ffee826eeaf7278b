"""Ticker deadline arithmetic, spin tail, overrun skipping and drift, on a fake clock."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from robotd.control.ticker import OverrunLog, RateLimiter, Ticker

PERIOD = 10_000_000  # 100 Hz
SPIN = 200_000


class FakeClock:
    """A monotonic ns clock that only moves when slept on, read (spin cost) or told to."""

    def __init__(self, start: int = 1_000_000_000, read_cost: int = 1_000) -> None:
        self.now = start
        self.read_cost = read_cost
        self.reads = 0
        self.sleeps: list[int] = []  # requested sleeps in ns
        self.oversleep: Callable[[], int] = lambda: 0  # extra ns each sleep takes

    def clock(self) -> int:
        self.reads += 1
        value = self.now
        self.now += self.read_cost
        return value

    def sleep(self, seconds: float) -> None:
        assert seconds > 0, "the ticker must never ask for a zero or negative sleep"
        ns = round(seconds * 1e9)
        self.sleeps.append(ns)
        self.now += ns + self.oversleep()

    def work(self, ns: int) -> None:
        self.now += ns


def make(clock: FakeClock, period: int = PERIOD, spin: int = SPIN) -> Ticker:
    return Ticker(period, spin_ns=spin, clock=clock.clock, sleep=clock.sleep)


def test_first_deadline_is_one_period_after_start() -> None:
    fc = FakeClock()
    t = make(fc)
    t.start(now_ns=5_000_000_000)
    assert t.origin_ns == 5_000_000_000 + PERIOD
    tick = t.wait()
    assert tick.index == 0
    assert tick.deadline_ns == 5_000_000_000 + PERIOD
    assert tick.woke_ns >= tick.deadline_ns
    assert tick.lateness_ns == tick.woke_ns - tick.deadline_ns
    assert tick.skipped == 0


def test_start_defaults_to_clock_and_wait_before_start_fails() -> None:
    fc = FakeClock(start=7_000)
    t = make(fc)
    with pytest.raises(RuntimeError, match="start"):
        t.wait()
    t.start()
    assert t.origin_ns == 7_000 + PERIOD


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_bad_period_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="period_ns"):
        Ticker(bad)  # type: ignore[arg-type]


def test_spin_tail_sleeps_to_spin_before_deadline_then_spins() -> None:
    fc = FakeClock(read_cost=1_000)
    t = make(fc)
    t.start(now_ns=fc.now)
    start = fc.now
    tick = t.wait()
    # one sleep, computed from the absolute deadline, to end spin_ns before it
    assert len(fc.sleeps) == 1
    assert start + fc.sleeps[0] == tick.deadline_ns - SPIN
    # then ~spin_ns / read_cost clock reads of spinning, waking at (not before) the deadline
    assert fc.reads >= SPIN // 1_000
    assert 0 <= tick.lateness_ns < 1_000


def test_no_sleep_when_inside_the_spin_window() -> None:
    fc = FakeClock()
    t = make(fc)
    t.start(now_ns=fc.now)
    t.wait()
    fc.work(PERIOD - 100_000)  # next deadline is now < spin_ns away
    n_sleeps = len(fc.sleeps)
    tick = t.wait()
    assert len(fc.sleeps) == n_sleeps
    assert tick.index == 1 and 0 <= tick.lateness_ns < 1_000


def test_deadlines_are_periodic_and_lateness_reports_oversleep() -> None:
    fc = FakeClock(start=0, read_cost=0)
    fc.oversleep = lambda: 300_000  # the kernel wakes 300 µs late: past the 200 µs spin tail
    t = make(fc)
    t.start(now_ns=0)
    ticks = [t.wait() for _ in range(5)]
    assert [k.index for k in ticks] == [0, 1, 2, 3, 4]
    assert [k.deadline_ns for k in ticks] == [PERIOD * (i + 1) for i in range(5)]
    assert all(k.lateness_ns == 100_000 for k in ticks)
    assert all(k.sleep_lateness_ns == 300_000 for k in ticks)
    assert t.missed == 0 and t.ticks == 5


def test_overrun_skips_to_next_future_deadline_without_burst() -> None:
    fc = FakeClock()
    t = make(fc)
    t.start(now_ns=fc.now)
    first = t.wait()
    assert first.index == 0
    # the tick's work overruns: wait() is entered 3.4 periods after deadline 1
    fc.now = t.origin_ns + PERIOD + int(3.4 * PERIOD)
    late = t.wait()
    assert late.index == 1 and late.overrun
    assert late.lateness_ns >= int(3.4 * PERIOD)
    assert late.skipped == 0
    assert t.missed == 3 and t.overruns == 1
    # deadlines 2, 3, 4 are gone; the next one is 5, 0.6 periods in the future
    assert t.next_deadline_ns == t.origin_ns + 5 * PERIOD
    assert t.next_deadline_ns > fc.now
    n_sleeps = len(fc.sleeps)
    nxt = t.wait()
    assert nxt.index == 5 and nxt.skipped == 3 and not nxt.overrun
    assert len(fc.sleeps) == n_sleeps + 1  # it slept: no catch-up tick with zero sleep
    assert nxt.woke_ns - late.woke_ns > PERIOD // 2
    after = t.wait()
    assert after.index == 6 and after.skipped == 0 and t.missed == 3 and t.overruns == 1


@pytest.mark.parametrize(
    ("late", "skipped", "overrun"),
    [
        (0.0, 0, False),
        (0.5, 0, False),  # exactly half a period: on time
        (0.6, 0, True),  # an overrun, but deadline 2 is still ahead: no skip
        (0.999, 0, True),
        (1.0, 1, True),  # deadline 2 is due right now, not in the future: skipped
        (3.4, 3, True),  # deadline 5 is 0.6 periods ahead
        (3.6, 3, True),  # deadline 5 is 0.4 periods ahead: still the next one, not 6
    ],
)
def test_next_deadline_is_the_first_strictly_in_the_future(
    late: float, skipped: int, overrun: bool
) -> None:
    fc = FakeClock(start=0, read_cost=1)  # each read moves 1 ns: the spin ends
    t = make(fc)
    t.start(now_ns=0)
    t.wait()
    lateness = round(late * PERIOD)
    fc.now = t.origin_ns + PERIOD + lateness  # wake `late` periods after deadline 1
    tick = t.wait()
    assert (tick.index, tick.lateness_ns, tick.overrun) == (1, lateness, overrun)
    assert t.missed == skipped and t.overruns == int(overrun)
    nxt_index = 1 + skipped + 1
    assert t.next_deadline_ns == t.origin_ns + nxt_index * PERIOD > tick.woke_ns
    nxt = t.wait()
    assert (nxt.index, nxt.skipped, nxt.overrun) == (nxt_index, skipped, False)
    assert t.missed == skipped and t.ticks == 3


def test_sleep_lateness_is_measured_before_the_spin_tail() -> None:
    fc = FakeClock(start=0, read_cost=1)
    fc.oversleep = lambda: 50_000  # the kernel wakes 50 µs late: inside the 200 µs spin tail
    t = make(fc)
    t.start(now_ns=0)
    tick = t.wait()
    assert tick.lateness_ns <= 1  # the spin tail hides it ...
    # ... but the wake-up is reported (+1: the read before the sleep moved the clock)
    assert tick.sleep_lateness_ns == 50_000 + 1
    fc.work(PERIOD - 100_000)  # inside the spin window: no sleep, nothing to report
    assert t.wait().sleep_lateness_ns is None


def test_no_drift_over_10000_ticks_with_jitter() -> None:
    rng = random.Random(1234)
    fc = FakeClock(read_cost=3_000)
    fc.oversleep = lambda: rng.randrange(0, 150_000)  # wake jitter, inside the spin tail
    t = make(fc)
    t.start(now_ns=fc.now)
    origin = t.origin_ns
    for k in range(10_000):
        fc.work(rng.randrange(0, 6_000_000))  # per-tick work jitter, under the period
        tick = t.wait()
        assert tick.index == k
        assert tick.deadline_ns == origin + k * PERIOD
        assert 0 <= tick.lateness_ns < 3_000
    assert t.missed == 0 and t.ticks == 10_000


def test_no_drift_with_random_overruns() -> None:
    rng = random.Random(99)
    fc = FakeClock(read_cost=500)
    t = make(fc)
    t.start(now_ns=fc.now)
    origin = t.origin_ns
    skipped_total = 0
    last_index = -1
    for _ in range(2_000):
        if rng.random() < 0.05:
            fc.work(rng.randrange(PERIOD, 5 * PERIOD))
        tick = t.wait()
        assert tick.deadline_ns == origin + tick.index * PERIOD
        assert tick.index == last_index + 1 + tick.skipped
        skipped_total += tick.skipped
        last_index = tick.index
    skipped_total += t.wait().skipped  # flush a skip still pending after the last tick
    assert skipped_total == t.missed > 0


def test_spin_longer_than_period_is_capped() -> None:
    fc = FakeClock(read_cost=10_000)
    t = Ticker(100_000, spin_ns=1_000_000, clock=fc.clock, sleep=fc.sleep)
    assert t.spin_ns == 100_000
    t.start(now_ns=fc.now)
    assert t.wait().index == 0


def test_from_hz() -> None:
    assert Ticker.from_hz(100).period_ns == 10_000_000
    assert Ticker.from_hz(30).period_ns == 33_333_333
    with pytest.raises(ValueError, match="hz"):
        Ticker.from_hz(0)


def test_rate_limiter_and_overrun_log() -> None:
    lim = RateLimiter(1_000)
    assert lim.allow(0)
    assert not lim.allow(999)
    assert lim.allow(1_000)
    log = OverrunLog(1_000_000_000)
    assert log.record(0, 3) == (1, 3)
    assert log.record(100, 1) is None
    assert log.record(200, 2) is None
    assert log.record(1_000_000_000, 5) == (3, 8)  # the quiet ones are reported with it


def test_real_clock_smoke() -> None:
    t = Ticker(2_000_000, spin_ns=200_000)
    t.start()
    ticks = [t.wait() for _ in range(5)]
    # A loaded machine may skip deadlines (that is the overrun rule); what must hold is
    # the arithmetic: rising indices, deadlines on the grid, never woken early.
    indices = [k.index for k in ticks]
    assert indices == sorted(set(indices)) and indices[0] == 0
    assert all(k.deadline_ns == t.origin_ns + k.index * t.period_ns for k in ticks)
    assert all(k.lateness_ns >= 0 for k in ticks)
