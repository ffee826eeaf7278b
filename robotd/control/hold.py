"""What the robot does when there is nothing to play, and how long it may keep doing it.

:class:`Hold` is the hold action per control mode (SPEC §5): absolute position control holds
the last commanded target; delta and velocity control hold still with zero motion; gripper dims
keep their last command in every mode. :class:`Watchdog` counts consecutive holds and trips
when ``max_hold_steps`` is reached. Both run every tick: no allocation beyond tiny temporaries.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

ControlMode = Literal["absolute", "delta", "velocity"]


class Hold:
    """The hold action per control mode.

    absolute → the last commanded target (before any command: where the joints were, see
    :meth:`set_initial`); delta / velocity → zero motion; grippers keep their last command
    (before any command: their initial position) in every mode.
    """

    def __init__(self, dim: int, mode: ControlMode, grippers: tuple[int, ...]) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"Hold: dim must be an integer >= 1, got {dim!r}")
        if mode not in get_args(ControlMode):
            raise ValueError(f"Hold: mode must be one of {get_args(ControlMode)}, got {mode!r}")
        grippers = tuple(grippers)
        for g in grippers:
            if isinstance(g, bool) or not isinstance(g, int | np.integer) or not 0 <= g < dim:
                raise ValueError(f"Hold: gripper dim {g!r} is not an integer in 0..{dim - 1}")
        if len(set(grippers)) != len(grippers):
            raise ValueError(f"Hold: grippers {grippers} hold a duplicate dim")
        self.dim = dim
        self.mode: ControlMode = mode
        self.grippers = grippers
        self._grip = np.asarray(grippers, dtype=np.intp)
        self._absolute = mode == "absolute"
        self._action = np.zeros(dim)  # zero motion in delta/velocity modes, except grippers
        self._view = self._action.view()
        self._view.flags.writeable = False
        self._known = not self._absolute and not grippers  # zeros are already a full answer

    def set_initial(self, position: np.ndarray) -> None:
        """Hold where the joints are: before anything was commanded, or after the robot was
        moved by something other than the queue (e.g. homing). Only the gripper dims are used
        in delta/velocity mode."""
        position = self._check(position, "set_initial", "position")
        if self._absolute:
            np.copyto(self._action, position)
        elif self._grip.size:
            self._action[self._grip] = position[self._grip]
        self._known = True

    def commanded(self, action: np.ndarray) -> None:
        """Record the action just sent to the joints (after the shield)."""
        action = self._check(action, "commanded", "action")
        if self._absolute:
            np.copyto(self._action, action)
        elif self._grip.size:
            self._action[self._grip] = action[self._grip]
        self._known = True

    def action(self) -> np.ndarray:
        """The hold action now: a preallocated read-only array, updated in place by
        :meth:`commanded` and :meth:`set_initial`. Raises RuntimeError when the hold depends on
        a position not yet known (absolute mode or grippers, before set_initial/commanded)."""
        if not self._known:
            raise RuntimeError(
                f"Hold.action: no position known yet in {self.mode} mode"
                f"{' with grippers' if self.grippers else ''}; call set_initial first"
            )
        return self._view

    def _check(self, value: np.ndarray, where: str, name: str) -> np.ndarray:
        arr = np.asarray(value)
        if arr.shape != (self.dim,):
            raise ValueError(f"Hold.{where}: {name} shape {arr.shape}, expected ({self.dim},)")
        if not np.isfinite(arr).all():
            raise ValueError(f"Hold.{where}: {name} holds a non-finite value: {arr}")
        return arr


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
