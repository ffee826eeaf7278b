"""The realtime ticker: absolute monotonic deadlines, a sleep, then a short spin tail.

Deadlines are ``origin_ns + k * period_ns`` for whole ``k``, computed from the origin
every time, so no error ever accumulates (openpi's runtime sleeps relative to
``time.time()`` and drifts; robotd does not). Each wait sleeps until ``spin_ns``
before the deadline and then spins on the clock to the deadline itself: the sleep
gives the CPU away, the spin removes the kernel's wake-up jitter (timer slack,
scheduler latency) from the last stretch.

``time.sleep`` takes a relative duration, but CPython 3.11+ on Linux turns it
straight into ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, now + duration)``;
the duration is recomputed from the absolute deadline at every wait, so the only
error is the few hundred nanoseconds between our clock read and CPython's, which
the spin tail absorbs.

Lateness never causes a catch-up burst: after waking ``L`` late for deadline ``i``
the next deadline is the first one strictly in the future, ``i + floor(L/P) + 1``.
The ``floor(L/P)`` deadlines that passed without a tick are counted in
:attr:`Ticker.missed` and reported on the next tick as :attr:`Tick.skipped`; a wake
more than half a period late is an overrun, counted in :attr:`Ticker.overruns`
(whether or not a deadline was skipped) and flagged on its tick as
:attr:`Tick.overrun`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["OverrunLog", "RateLimiter", "Tick", "Ticker"]


@dataclass(slots=True)
class Tick:
    """One resumption of the control loop.

    ``index`` counts deadlines since :meth:`Ticker.start`, skipped ones included, so
    ``deadline_ns == origin_ns + index * period_ns`` always holds.
    """

    index: int  # tick number since start (counts skipped deadlines too)
    deadline_ns: int  # the absolute deadline this tick was meant for
    woke_ns: int  # when the loop actually resumed
    lateness_ns: int  # woke_ns - deadline_ns (>= 0 with a real clock)
    skipped: int  # deadlines skipped just before this tick (the previous wake was late)
    overrun: bool = False  # this wake was more than half a period late
    # How late the sleep's wake-up was: the clock right after the sleep returned minus
    # what it aimed for (deadline_ns - spin_ns), before the spin tail hid it. None when
    # this wait did not sleep (already within the spin window, or late).
    sleep_lateness_ns: int | None = None


class Ticker:
    """Wakes the caller at ``origin + k * period`` for k = 0, 1, 2, ...

    Contract:
      - :meth:`start` fixes the origin; tick 0's deadline is one period after "now".
      - :meth:`wait` blocks until the next deadline and returns its :class:`Tick`.
        It never returns before the deadline (with a monotonic clock).
      - After a wake ``L`` ns late for deadline ``i`` the next deadline is
        ``i + L // period + 1``, the first one strictly after the wake: the
        ``L // period`` passed deadlines are skipped (counted in :attr:`missed`,
        reported on the next tick's ``skipped``), never played as a burst.
      - A wake more than ``period/2`` late is an overrun (counted in :attr:`overruns`,
        flagged in ``Tick.overrun``), skipped deadlines or not.
      - ``clock`` (integer ns, monotonic) and ``sleep`` (seconds) are injectable, so
        a fake clock advanced by a fake sleep makes the ticker fully deterministic.
      - Not thread-safe: one loop thread owns a ticker.
    """

    __slots__ = (
        "_clock",
        "_next_index",
        "_origin_ns",
        "_pending_skipped",
        "_sleep",
        "missed",
        "overruns",
        "period_ns",
        "spin_ns",
        "ticks",
    )

    def __init__(
        self,
        period_ns: int,
        *,
        spin_ns: int = 200_000,
        clock: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if isinstance(period_ns, bool) or not isinstance(period_ns, int) or period_ns <= 0:
            raise ValueError(f"Ticker: period_ns must be a positive int, got {period_ns!r}")
        if isinstance(spin_ns, bool) or not isinstance(spin_ns, int) or spin_ns < 0:
            raise ValueError(f"Ticker: spin_ns must be an int >= 0, got {spin_ns!r}")
        self.period_ns = period_ns
        # A spin tail longer than the period would spin forever; cap it.
        self.spin_ns = min(spin_ns, period_ns)
        self._clock = clock
        self._sleep = sleep
        self._origin_ns: int | None = None
        self._next_index = 0
        self._pending_skipped = 0
        self.ticks = 0  # ticks returned by wait()
        self.missed = 0  # deadlines passed without a tick
        self.overruns = 0  # wakes more than half a period late

    @classmethod
    def from_hz(
        cls,
        hz: float,
        *,
        spin_ns: int = 200_000,
        clock: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Ticker:
        """A ticker at ``hz`` ticks a second (the period rounded to whole ns)."""
        if not hz > 0:
            raise ValueError(f"Ticker: hz must be > 0, got {hz!r}")
        return cls(round(1e9 / hz), spin_ns=spin_ns, clock=clock, sleep=sleep)

    @property
    def origin_ns(self) -> int:
        """Tick 0's deadline; tick k's is ``origin_ns + k * period_ns``."""
        if self._origin_ns is None:
            raise RuntimeError("Ticker: start() has not been called")
        return self._origin_ns

    @property
    def next_deadline_ns(self) -> int:
        """The deadline the next :meth:`wait` will wait for."""
        return self.origin_ns + self._next_index * self.period_ns

    def start(self, now_ns: int | None = None) -> None:
        """Fix the origin: tick 0 is due one period after ``now_ns`` (default: the clock).

        Calling it again restarts the ticker from a new origin (counters are kept).
        """
        now = self._clock() if now_ns is None else now_ns
        self._origin_ns = now + self.period_ns
        self._next_index = 0
        self._pending_skipped = 0

    def wait(self) -> Tick:
        """Block until the next deadline (sleep, then spin) and return its tick."""
        if self._origin_ns is None:
            raise RuntimeError("Ticker: wait() called before start()")
        period = self.period_ns
        index = self._next_index
        deadline = self._origin_ns + index * period
        clock = self._clock
        now = clock()
        remaining = deadline - self.spin_ns - now
        slept: int | None = None
        if remaining > 0:
            self._sleep(remaining / 1e9)
            now = clock()
            slept = now - (deadline - self.spin_ns)
        while now < deadline:  # the spin tail
            now = clock()
        lateness = now - deadline  # >= 0: the spin never lets it return early
        # The next deadline is the first strictly after `now`; the ones in between
        # passed without a tick. Within a period of the deadline that is index + 1.
        skipped_after = lateness // period
        overrun = 2 * lateness > period
        if overrun:
            self.overruns += 1
        self.missed += skipped_after
        self._next_index = index + skipped_after + 1
        tick = Tick(index, deadline, now, lateness, self._pending_skipped, overrun, slept)
        self._pending_skipped = skipped_after
        self.ticks += 1
        return tick


class RateLimiter:
    """Says yes at most once per ``interval_ns`` of the caller's clock.

    The first call always says yes. Times are whatever clock the caller uses
    (monotonic ns); a clock that goes backwards just delays the next yes.
    """

    __slots__ = ("_last_ns", "interval_ns")

    def __init__(self, interval_ns: int = 1_000_000_000) -> None:
        if interval_ns < 0:
            raise ValueError(f"RateLimiter: interval_ns must be >= 0, got {interval_ns!r}")
        self.interval_ns = interval_ns
        self._last_ns: int | None = None

    def allow(self, now_ns: int) -> bool:
        """True (and restart the interval) if the last yes was ``interval_ns`` ago or more."""
        if self._last_ns is None or now_ns - self._last_ns >= self.interval_ns:
            self._last_ns = now_ns
            return True
        return False


class OverrunLog:
    """Rate-limits overrun warnings (at most one per interval) without losing counts.

    Call :meth:`record` for every overrun (each tick with ``tick.overrun``, passing
    ``tick.woke_ns`` and ``tick.lateness_ns // period_ns``, the deadlines it makes the
    ticker skip); when it returns a pair, log it: the number of overruns and of skipped
    deadlines since the previous report, this one included.
    """

    __slots__ = ("_events", "_limiter", "_skipped")

    def __init__(self, interval_ns: int = 1_000_000_000) -> None:
        self._limiter = RateLimiter(interval_ns)
        self._events = 0
        self._skipped = 0

    def record(self, now_ns: int, skipped: int) -> tuple[int, int] | None:
        """Count one overrun; return ``(overruns, skipped)`` to log now, or None to stay quiet."""
        self._events += 1
        self._skipped += skipped
        if not self._limiter.allow(now_ns):
            return None
        report = (self._events, self._skipped)
        self._events = 0
        self._skipped = 0
        return report
