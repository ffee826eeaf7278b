"""The safety shield: every joint target, the hold included, passes here before the joints.

Checks, in order: shape/dtype/finite (reject), position limits with a clip tolerance
(clip within it, reject beyond), per-tick velocity and acceleration limits (clamp).
A run of `reject_run` rejections asks the caller to latch FAULT. The shield works
on absolute joint targets; delta and velocity actions are turned into targets by
the kernel first, so one set of limits covers every control mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robotd.control.counters import ShieldCounters

OK, CLIPPED, CLAMPED, REJECTED = "ok", "clipped", "clamped", "rejected"


@dataclass(slots=True)
class Verdict:
    target: np.ndarray  # what may be written (the previous target when rejected)
    outcome: str  # ok | clipped | clamped | rejected
    reason: str = ""
    fault: bool = False  # a run of rejections: latch FAULT


def _clip(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    # np.clip's Python-level dispatch costs several µs on a handful of joints; this is two ufuncs.
    return np.minimum(np.maximum(x, lo), hi)


class Shield:
    """Limits every target; stateless apart from the last two targets and counters."""

    def __init__(
        self,
        names: list[str],
        lower: np.ndarray,
        upper: np.ndarray,
        *,
        clip_tolerance: float,
        dt: float,
        max_velocity: np.ndarray | None = None,
        max_acceleration: np.ndarray | None = None,
        reject_run: int = 5,
    ) -> None:
        self.names = names
        self.lower = np.asarray(lower, dtype=np.float64)
        self.upper = np.asarray(upper, dtype=np.float64)
        self.tol = float(clip_tolerance)
        self.max_step = None if max_velocity is None else np.asarray(max_velocity) * dt
        self.max_dstep = (
            None if max_acceleration is None else np.asarray(max_acceleration) * dt * dt
        )
        self.reject_run = reject_run
        self.counters = ShieldCounters()
        self._run = 0
        self._last: np.ndarray | None = None
        self._prev_step: np.ndarray | None = None

    def reset(self, position: np.ndarray) -> None:
        """Anchor the rate limits at the joints' present position (start-up, after a fault)."""
        self._last = np.clip(np.asarray(position, dtype=np.float64), self.lower, self.upper)
        self._prev_step = np.zeros_like(self._last)
        self._run = 0

    @property
    def last(self) -> np.ndarray | None:
        return self._last

    def _reject(self, reason: str) -> Verdict:
        self.counters.rejected += 1
        self._run += 1
        assert self._last is not None
        return Verdict(self._last, REJECTED, reason, fault=self._run >= self.reject_run)

    def check(self, target: object) -> Verdict:
        """Pass, clip, clamp or reject one absolute joint target."""
        if self._last is None:
            raise RuntimeError("Shield.check before reset(position)")
        if not isinstance(target, np.ndarray) or target.dtype.kind != "f":
            kind = type(target).__name__ if not isinstance(target, np.ndarray) else target.dtype
            return self._reject(f"action must be a float array, got {kind}")
        if target.shape != self._last.shape:
            return self._reject(f"action shape {target.shape}, expected {self._last.shape}")
        # One pass for the common case: max(lower - t, t - upper) <= 0 over every joint
        # means finite and within limits (a NaN makes the max NaN, an inf makes it inf).
        out = np.maximum(self.lower - target, target - self.upper)
        outcome, reason = OK, ""
        if not out.max() <= 0.0:
            if not np.isfinite(target).all():
                bad = [self.names[i] for i in np.flatnonzero(~np.isfinite(target))]
                return self._reject(f"non-finite action for {', '.join(bad)}")
            worst = int(np.argmax(out))
            if out[worst] > self.tol:
                return self._reject(
                    f"{self.names[worst]} target {target[worst]:.4f} outside "
                    f"[{self.lower[worst]:.4f}, {self.upper[worst]:.4f}] by more than {self.tol}"
                )
            target = _clip(target, self.lower, self.upper)  # a new array: owned
            self.counters.clipped += 1
            outcome, reason = CLIPPED, f"{self.names[worst]} clipped into its limits"
        else:
            # Own the target: the queue hands out a row buffer it overwrites on the next pop.
            target = target.astype(np.float64, copy=True)
        step = target - self._last
        limited = step
        if self.max_dstep is not None:
            limited = _clip(
                limited, self._prev_step - self.max_dstep, self._prev_step + self.max_dstep
            )
        if self.max_step is not None:
            limited = _clip(limited, -self.max_step, self.max_step)
        if limited is not step and (limited != step).any():
            worst = int(np.argmax(np.abs(step - limited)))
            self.counters.clamped += 1
            name = self.names[worst]
            self.counters.per_joint[name] = self.counters.per_joint.get(name, 0) + 1
            target = self._last + limited
            outcome, reason = CLAMPED, f"{name} rate limited"
        self._prev_step = target - self._last
        self._last = target
        self._run = 0
        return Verdict(target, outcome, reason)

    def hold(self) -> np.ndarray:
        """The last target that passed: always within limits, zero velocity."""
        assert self._last is not None
        self._prev_step = np.zeros_like(self._last)
        return self._last
