"""Asks answered in process, as the main process answers them on the wall clock.

The window is planned from the policy's declared observations (WindowPlanner), read from a
ring of the kernel's step records through the one StepReader (frames rendered by the
virtual rig), handed to the policy through PolicyHost, and the answer made fit for the lane
(robotd.link.chunks). Timing (SPEC §5): in sync the world waits and the chunk is merged at
the ask's own tick; in realtime the act takes ``ceil(latency * hz)`` ticks, and those
ticks run before the chunk is merged at the start of the tick it arrives on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from drivers.sim.virtual import VirtualRig
from robotd.config import Config
from robotd.contract import Actions
from robotd.control.kernel import Kernel
from robotd.control.playback import Chunk
from robotd.lane.messages import Ask, FrameRef, Step
from robotd.link.chunks import ChunkLimits, prepare
from robotd.link.steps import FrameLost, StepReader, StepRing
from robotd.link.windows import WindowPlanner, assemble
from robotd.worker.policy_host import PolicyHost, PolicyLoadError


class RigFrames:
    """The virtual rig's renders as a FrameSource (its LookupError is a lost frame)."""

    def __init__(self, rig: VirtualRig) -> None:
        self.rig = rig

    def has(self, camera: str) -> bool:
        return self.rig.has(camera)

    def frame(self, camera: str, ref: FrameRef) -> np.ndarray:
        try:
            return self.rig.frame(camera, ref)
        except LookupError as exc:
            raise FrameLost(str(exc)) from None


class VirtualAsker:
    """The kernel's `asker`: answers at once in sync, schedules realtime answers
    `latency` ticks on (delivered by `deliver_due` before that tick's update)."""

    def __init__(self, cfg: Config, policy: Any, rig: VirtualRig, latency_s: float | None):
        self.hz = cfg.control.hz
        self.sync = cfg.control.timing == "sync"
        self.latency_s = latency_s
        try:
            self.host = PolicyHost.wrap(policy)
        except PolicyLoadError as exc:
            raise TypeError(f"run_virtual: {exc}") from None
        obs = self.host.observations
        self.actions: Actions | None = self.host.actions
        self.planner = WindowPlanner(
            obs.resolve(self.hz) if obs is not None else None, cfg.observation_keys
        )
        self.steps = StepRing(keep=self.planner.lookback + 2 * math.ceil(self.hz) + 16)
        rig.keep_s = self.steps.keep / self.hz
        self.reader = StepReader(self.steps, RigFrames(rig))
        self.limits = ChunkLimits(cfg.policy.max_chunk_rows, len(cfg.joints.names))
        self.kernel: Kernel | None = None
        self.tick = 0
        self.due: dict[int, list[Callable[[], None]]] = {}
        self._wep = ""
        self._prev_act: int | None = None

    def on_step(self, rec: Step) -> None:
        self.steps.add(rec)

    def __call__(self, ask: Ask) -> Chunk | None:
        wep, step = ask.wep, ask.s
        if wep != self._wep:
            self._wep, self._prev_act = wep, None
        started = time.perf_counter()
        try:
            self.host.begin(wep)  # reset() on a new episode
            window = self.planner.plan(step, self._prev_act)
            inputs = assemble(window, lambda s, k: self.reader.value(wep, s, k))
            self._prev_act = step
            answer = self.host.infer(self.host.inputs(inputs["steps"], inputs["observations"]), wep)
            rows = prepare(answer, self.actions, self.hz, self.limits)
            outcome: Chunk | str = Chunk(ask.id, wep, step, rows)
        except Exception as exc:  # a failing policy is an act failure, never a crash
            outcome = f"act failed: {type(exc).__name__}: {exc}"
        delay = self._delay(time.perf_counter() - started)
        if delay == 0:
            if isinstance(outcome, Chunk):
                return outcome
            self._arrive(ask.id, outcome)
            return None
        self.due.setdefault(self.tick + delay, []).append(lambda: self._arrive(ask.id, outcome))
        return None

    def _delay(self, measured_s: float) -> int:
        """Ticks the act takes: none in sync (the world waits), else ceil(latency * hz)."""
        if self.sync:
            return 0
        latency = measured_s if self.latency_s is None else self.latency_s
        return max(0, math.ceil(latency * self.hz - 1e-9))  # 0.1 s * 30 Hz is 3, not 4

    def _arrive(self, ask_id: int, outcome: Chunk | str) -> None:
        assert self.kernel is not None
        if isinstance(outcome, Chunk):
            self.kernel.deliver(outcome)
        else:
            self.kernel.act_failed(ask_id, outcome)

    def deliver_due(self, tick: int) -> None:
        """Hand the kernel every answer arriving at `tick` (before its update)."""
        self.tick = tick
        for arrive in self.due.pop(tick, []):
            arrive()
