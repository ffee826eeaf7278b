"""Step records: what each control tick observed, as the lane's `Step` message.

A step's observation is what the drivers held at its tick: the joint state read that
tick and each camera's newest frame reference (index and capture time). A camera whose
newest frame is older than its `max_age_ms` (or that has none) makes the observation
invalid: no act is asked from it. A step an overrun skipped repeats the last record,
marked skipped, so that rows keep their meant-for step.
"""

from __future__ import annotations

from collections.abc import Mapping

from drivers.base import JointState
from robotd.control.counters import Counters
from robotd.lane.messages import FrameRef, Step


class StepRecorder:
    """Builds the Step record of each tick; `last` is the newest (None after a reset).
    Each record carries the tick count of `counters` (the kernel's) when it was made."""

    def __init__(
        self, camera_max_age_ns: Mapping[str, int], counters: Counters | None = None
    ) -> None:
        self.limits = dict(camera_max_age_ns)
        self.counters = counters or Counters()
        self.last: Step | None = None
        self.stale: tuple[str, ...] = ()  # the cameras that made the last record invalid

    def reset(self) -> None:
        """A new worker-side episode: nothing recorded yet."""
        self.last = None
        self.stale = ()

    def record(
        self,
        *,
        episode: int,
        wep: str,
        step: int,
        now_ns: int,
        joints: JointState,
        frames: Mapping[str, FrameRef | None],
        truth: dict[str, float] | None,
    ) -> Step:
        """The record of this tick's step; `ok` False when a camera's frame is missing or
        too old."""
        cams: dict[str, FrameRef | None] = {}
        ok = True
        for name, limit in self.limits.items():
            ref = frames.get(name)
            cams[name] = ref
            if ref is None or now_ns - ref[1] > limit:
                ok = False
        if not ok:  # which cameras, said by status: only on a step that has some
            stale = tuple(n for n, lim in self.limits.items()
                          if (r := cams[n]) is None or now_ns - r[1] > lim)
            if stale != self.stale:
                self.stale = stale
        elif self.stale:
            self.stale = ()
        rec = Step(
            episode,
            wep,
            step,
            now_ns,
            joints.position.tolist(),
            joints.velocity.tolist(),
            cams,
            ok,
            gt=truth or None,
            tick=self.counters.ticks,
        )
        self.last = rec
        return rec

    def skipped(self, step: int) -> Step | None:
        """The record of a skipped step: the last one's observation, marked, or None when
        nothing was recorded yet in this episode."""
        last = self.last
        if last is None:
            return None
        return Step(last.ep, last.wep, step, last.t, last.pos, last.vel, last.cams, last.ok, True,
                    tick=self.counters.ticks)
