"""Logging a trouble that repeats: said at once, then at most once a period, with a count.

A cause that lasts (a worker gone, a flaky bus, refused uploads) reports itself every few
ticks; logging each report would bury everything else, logging only the first would hide
that it went on. `Repeats` keeps, per kind, when it was last said and how many reports went
unsaid since, so the next line can say "+N more".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_KINDS = 256  # kinds remembered; the oldest is forgotten (and said again) past it


@dataclass(frozen=True, slots=True)
class Said:
    """What a line about a repeating kind adds: `unsaid` reports since the last line,
    `since_s` seconds ago (infinite the first time)."""

    unsaid: int
    since_s: float

    @property
    def tail(self) -> str:
        """What the line ends with: " (+N more in the last X s)" when reports went unsaid,
        "" when none did. One wording for every repeated line, so that a reader (or a grep)
        of the log finds them all alike."""
        if not self.unsaid:
            return ""
        # at least "1 s": a burst said within a second is not "in the last 0 s"
        return f" (+{self.unsaid} more in the last {max(self.since_s, 1.0):.0f} s)"


class Repeats:
    """Per kind: say the first report, then at most one every `every_s` of `clock`."""

    def __init__(self, every_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if not every_s >= 0:
            raise ValueError(f"Repeats: every_s must be >= 0, got {every_s!r}")
        self.every_s = float(every_s)
        self.clock = clock
        self._kinds: dict[str, tuple[float, int]] = {}  # kind -> (last said, unsaid since)

    def say(self, kind: str) -> Said | None:
        """A report of `kind`: what to add to its line when it is to be said now, None when
        it is to stay quiet (it is counted for the next line)."""
        now = self.clock()
        seen = self._kinds.get(kind)
        if seen is not None and now - seen[0] < self.every_s:
            self._kinds[kind] = (seen[0], seen[1] + 1)
            return None
        if seen is None and len(self._kinds) >= MAX_KINDS:
            del self._kinds[next(iter(self._kinds))]
        self._kinds.pop(kind, None)  # re-inserted last: the dict's order is the age order
        self._kinds[kind] = (now, 0)
        return Said(0, float("inf")) if seen is None else Said(seen[1], now - seen[0])


class Burst:
    """Say up to `limit` reports per `every_s` window of `clock` (all kinds together), then
    count the rest for the next line said: for reports that each matter (every e-stop
    pressed) but whose flood (a client's bug) must not bury the log."""

    def __init__(
        self, limit: int, every_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if limit < 1 or not every_s > 0:
            raise ValueError(f"Burst: need limit >= 1 and every_s > 0, got {limit}, {every_s}")
        self.limit, self.every_s, self.clock = limit, float(every_s), clock
        self._window = -float("inf")  # when the current window opened
        self._said = 0  # said in it
        self._unsaid = 0  # not said since the last line
        self._last = -float("inf")  # when the last line was said

    def say(self) -> Said | None:
        """A report: what to add to its line when it is to be said now, None when it is to
        stay quiet (it is counted for the next line)."""
        now = self.clock()
        if now - self._window >= self.every_s:
            self._window, self._said = now, 0
        if self._said >= self.limit:
            self._unsaid += 1
            return None
        self._said += 1
        said = Said(self._unsaid, now - self._last)
        self._unsaid, self._last = 0, now
        return said
