"""The hold watchdog: a run of `max_hold_steps` consecutive holds ends a running episode.

(The hold action itself is the last target the shield passed: see Kernel._held. For
absolute control that is the last commanded target; for delta and velocity control it
is zero motion; the gripper keeps its last command in every mode.)
"""

from __future__ import annotations


class Watchdog:
    """Counts consecutive holds while an episode runs; trips at exactly ``max_hold_steps``.

    :meth:`held` returns True once, on the tick the run of consecutive holds reaches
    ``max_hold_steps``; further holds in the same run return False (``tripped`` stays True).
    :meth:`played` ends the run. :meth:`reset` (episode start) clears every count.
    """

    def __init__(self, max_hold_steps: int) -> None:
        if isinstance(max_hold_steps, bool) or not isinstance(max_hold_steps, int):
            raise ValueError(f"Watchdog: max_hold_steps must be an integer, got {max_hold_steps!r}")
        if max_hold_steps < 1:
            raise ValueError(f"Watchdog: max_hold_steps must be >= 1, got {max_hold_steps}")
        self.max_hold_steps = max_hold_steps
        self.consecutive = 0  # holds in the current run
        self.max_consecutive = 0  # longest run since reset
        self.holds = 0  # holds since reset

    @property
    def tripped(self) -> bool:
        """Whether the current run of holds has reached the limit."""
        return self.consecutive >= self.max_hold_steps

    def played(self) -> None:
        """A row was played this tick: the run of holds is over."""
        self.consecutive = 0

    def held(self) -> bool:
        """The robot held this tick. True exactly on the tick the limit is reached."""
        self.consecutive += 1
        self.holds += 1
        if self.consecutive > self.max_consecutive:
            self.max_consecutive = self.consecutive
        return self.consecutive == self.max_hold_steps

    def reset(self) -> None:
        """Start counting afresh (a new episode)."""
        self.consecutive = 0
        self.max_consecutive = 0
        self.holds = 0
