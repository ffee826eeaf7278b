"""The safety shield: every joint target, the hold included, passes here before the joints.

Checks, in order: shape/dtype/finite (reject), position limits with a clip tolerance
(clip within it, reject beyond), per-tick velocity and acceleration limits (clamp).
A run of `reject_run` rejections asks the caller to latch FAULT. The shield works
on absolute joint targets; delta and velocity actions are turned into targets by
the kernel first, so one set of limits covers every control mode.

Contract (property-tested): every target it hands out is finite and within
[lower, upper]; its per-tick step is within the velocity bound and its change of
step within the acceleration bound. With an acceleration bound a joint cannot stop
at once, so the shield also keeps every step short enough to brake before the
position limits, and a hold (or a rejection) is a controlled stop at the
acceleration bound rather than a dead stop.
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


def braking_step(room: np.ndarray, dstep: np.ndarray) -> np.ndarray:
    """The largest step towards a limit `room` away from which the joint can still stop in
    time, slowing by `dstep` a tick: the largest v with v + (v-d) + (v-2d) + ... <= room.

    For v in [n d, (n+1) d) that sum is (n+1) v - d n (n+1) / 2, and it reaches
    d n (n+1) / 2 at v = n d, which gives n and then v in closed form.
    """
    room = np.maximum(room, 0.0)
    n = np.floor((np.sqrt(1.0 + 8.0 * room / dstep) - 1.0) / 2.0)
    return (room + dstep * n * (n + 1.0) / 2.0) / (n + 1.0)


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
        self._velocity_range = (
            None if self.max_step is None else (-self.max_step, self.max_step)
        )
        self.max_dstep = (
            None if max_acceleration is None else np.asarray(max_acceleration) * dt * dt
        )
        self.reject_run = reject_run
        # The common tick (within limits and the velocity bound, no acceleration bound) is
        # checked on Python floats: on a handful of joints that is several times cheaper
        # than numpy's per-call dispatch, and it is the same double arithmetic.
        self._fast = None
        if self.max_dstep is None:
            steps = None
            if self.max_step is not None:
                steps = np.broadcast_to(self.max_step, self.lower.shape).tolist()
            self._fast = (self.lower.tolist(), self.upper.tolist(), steps)
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
        return Verdict(self.hold(), REJECTED, reason, fault=self._run >= self.reject_run)

    def _step_range(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The steps allowed this tick: velocity bound, acceleration bound, braking room."""
        assert self._last is not None and self._prev_step is not None
        if self.max_dstep is None:
            return self._velocity_range
        d = self.max_dstep
        lo = np.maximum(self._prev_step - d, -braking_step(self._last - self.lower, d))
        hi = np.minimum(self._prev_step + d, braking_step(self.upper - self._last, d))
        if self.max_step is not None:
            lo = np.maximum(lo, -self.max_step)
            hi = np.minimum(hi, self.max_step)
        # Never empty in exact arithmetic (slowing down by d is always allowed); rounding
        # could cross them by an ulp: the braking step lies within both then.
        crossed = lo > hi
        if crossed.any():
            brake = self._brake_step()
            lo = np.where(crossed, brake, lo)
            hi = np.where(crossed, brake, hi)
        return lo, hi

    def _brake_step(self) -> np.ndarray:
        """This tick's step of a controlled stop: the last step slowed by the acceleration
        bound (zero at once without one)."""
        assert self._prev_step is not None
        if self.max_dstep is None:
            return np.zeros_like(self._prev_step)
        u = self._prev_step
        return np.sign(u) * np.maximum(np.abs(u) - self.max_dstep, 0.0)

    def check(self, target: object) -> Verdict:
        """Pass, clip, clamp or reject one absolute joint target."""
        if self._last is None:
            raise RuntimeError("Shield.check before reset(position)")
        if not isinstance(target, np.ndarray) or target.dtype.kind != "f":
            kind = type(target).__name__ if not isinstance(target, np.ndarray) else target.dtype
            return self._reject(f"action must be a float array, got {kind}")
        if target.shape != self._last.shape:
            return self._reject(f"action shape {target.shape}, expected {self._last.shape}")
        if self._fast is not None and target.ndim == 1:
            passed = self._passes(target.tolist())
            if passed is not None:
                return passed
        # One pass for the common case: max(lower - t, t - upper) <= 0 for every joint means
        # finite and within limits (NaN compares false, an inf is > 0). On a handful of
        # joints Python compares a list faster than numpy dispatches a reduction (~1 µs).
        out = np.maximum(self.lower - target, target - self.upper)
        outcome, reason = OK, ""
        if not all(v <= 0.0 for v in out.tolist()):
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
        allowed = self._step_range()
        if allowed is not None:
            limited = _clip(step, *allowed)
            if limited.tolist() != step.tolist():  # (finite here: a list compare is cheaper)
                worst = int(np.argmax(np.abs(step - limited)))
                self.counters.clamped += 1
                name = self.names[worst]
                self.counters.per_joint[name] = self.counters.per_joint.get(name, 0) + 1
                # (the final clip only absorbs rounding: the step range keeps within limits)
                target = _clip(self._last + limited, self.lower, self.upper)
                outcome, reason = CLAMPED, f"{name} rate limited"
        return self._passed(target, outcome, reason)

    def _passed(self, target: np.ndarray, outcome: str = OK, reason: str = "") -> Verdict:
        """`target` (owned) is this tick's: the shield moves on from it."""
        self._advance(target)
        self._run = 0
        return Verdict(target, outcome, reason)

    def _passes(self, t: list[float]) -> Verdict | None:
        """The fast path: `t` within [lower, upper] and its step from the last target
        within the velocity bound (so finite), passed unchanged; None for anything else
        (the full check decides). The comparisons are exactly the numpy path's."""
        assert self._fast is not None and self._last is not None
        lower, upper, steps = self._fast
        for x, lo, hi in zip(t, lower, upper, strict=True):
            if not lo <= x <= hi:
                return None
        if steps is not None:
            for x, y, m in zip(t, self._last.tolist(), steps, strict=True):
                if not -m <= x - y <= m:
                    return None
        return self._passed(np.array(t, dtype=np.float64))  # owned: the queue reuses its rows

    def _advance(self, target: np.ndarray) -> None:
        assert self._last is not None
        if self.max_dstep is not None:  # only the acceleration bound looks at the last step
            self._prev_step = target - self._last
        self._last = target

    def hold(self) -> np.ndarray:
        """This tick's hold: the last target when the joint is still (or without an
        acceleration bound), else the next step of a controlled stop. Call once a tick."""
        assert self._last is not None
        brake = self._brake_step()
        if not brake.any():
            self._prev_step = brake
            return self._last
        self._advance(_clip(self._last + brake, self.lower, self.upper))
        return self._last
