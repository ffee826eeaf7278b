"""The ask → chunk delay the next act will take, predicted from the acts before it.

The control lane measures every merged act's delay in steps (the step its chunk merged at
minus the step it was asked at). The prediction `d` is a high quantile (nearest rank) of
the last `WINDOW` such delays, never below 1 step: every realtime act hands it to the
policy as the delay of its frozen prefix (robotd.control.playback), and an answer later
than it is an overrun. With `control.refill_steps = "auto"` the lane asks when the rows
left fall to `d + margin` (`refill()`): the margin covers a delay above the quantile, so
that such an act still finds rows to play instead of holding.

Before any act was measured `d` is 1: the run's first act has nothing to go on (its queue
is empty, so nothing is frozen either). `d` is at most the lane's bound on an ask's delay
(MAX_ROWS steps): one act that took minutes (a cold start, a server back after an outage)
must not make the next ask one the lane cannot send.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

from robotd.lane.messages import MAX_ROWS

WINDOW = 32  # recent acts the quantile is taken over: a link that slows down is seen soon


class DelayPredictor:
    """Recent act delays in, the next act's predicted delay (steps, >= 1) out.

    `quantile` in (0, 1]: 1 is the largest recent delay. `margin`: steps the auto refill
    adds to the prediction (>= 0).
    """

    def __init__(self, quantile: float = 0.9, margin: int = 1, window: int = WINDOW) -> None:
        if not (isinstance(quantile, int | float) and 0 < quantile <= 1):
            raise ValueError(f"DelayPredictor: quantile must be in (0, 1], got {quantile!r}")
        if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
            raise ValueError(f"DelayPredictor: margin must be an integer >= 0, got {margin!r}")
        if window < 1:
            raise ValueError(f"DelayPredictor: window must be >= 1, got {window!r}")
        self.quantile = float(quantile)
        self.margin = margin
        self._window = window
        self._recent: deque[int] = deque()
        self._ranked: list[int] = []  # the same delays, sorted (kept so, not sorted per act)
        # nearest rank (1-based) for each number of delays held
        self._rank = [max(1, math.ceil(self.quantile * n - 1e-9)) for n in range(window + 1)]
        self._predicted = 1

    def add(self, steps: int) -> None:
        """One merged act took `steps` steps (>= 0) from ask to merge."""
        steps = max(0, int(steps))
        if len(self._recent) == self._window:
            del self._ranked[bisect.bisect_left(self._ranked, self._recent.popleft())]
        self._recent.append(steps)
        bisect.insort(self._ranked, steps)
        self._predicted = min(MAX_ROWS, max(1, self._ranked[self._rank[len(self._ranked)] - 1]))

    def predict(self) -> int:
        """The next act's delay in steps (1..MAX_ROWS); O(1), it is read every tick."""
        return self._predicted

    def refill(self) -> int:
        """Auto refill: ask when at most this many rows remain (the prediction + margin)."""
        return self._predicted + self.margin

    @property
    def measured(self) -> int:
        """How many recent delays the prediction rests on (at most the window)."""
        return len(self._recent)
