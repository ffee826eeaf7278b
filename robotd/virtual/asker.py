"""Asks answered in process, as the main process answers them on the wall clock.

The window is planned from the policy's declared observations (WindowPlanner), read from a
ring of the kernel's step records through the one StepReader (frames rendered by the
virtual rig), handed to the policy through PolicyHost, and the answer made fit for the lane
(robotd.link.chunks). Timing (control.timing): in sync the world waits and the chunk is merged at
the ask's own tick; in realtime the act takes ``ceil(latency * hz)`` ticks, and those
ticks run before the chunk is merged at the start of the tick it arrives on. The latency
is fixed, one per act from a schedule (robotd.virtual.latency), or measured. A realtime
act's frozen prefix reaches a policy that takes it, as the worker hands it
(robotd.link.rtc). A camera stream that declares a camera spec is handed its frames
fitted, encoded and decoded again (robotd.frames), as they reach a worker.
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
from robotd.frames import decode, fit_and_encode, to_wire
from robotd.lane.messages import Ask, FrameRef, Step
from robotd.link.chunks import ChunkLimits, prepare
from robotd.link.rtc import rtc_request
from robotd.link.steps import FrameLost, StepReader, StepRing
from robotd.link.windows import WindowPlanner, assemble
from robotd.virtual.latency import LatencySchedule
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

    def __init__(
        self,
        cfg: Config,
        policy: Any,
        rig: VirtualRig,
        latency_s: float | LatencySchedule | None,
    ):
        self.hz = cfg.control.hz
        self.sync = cfg.control.timing == "sync"
        self.latency_s = latency_s
        self.acts = 0  # asks taken so far (a schedule's act number)
        try:
            self.host = PolicyHost.wrap(policy)
        except PolicyLoadError as exc:
            raise TypeError(f"run_virtual: {exc}") from None
        obs = self.host.observations
        self.actions: Actions | None = self.host.actions
        self.planner = WindowPlanner(
            obs.resolve(self.hz) if obs is not None else None, cfg.observation_keys
        )
        streams = obs.streams if obs is not None else {}
        self.cameras = {
            k: s.camera for k, s in streams.items() if s.camera is not None and k in cfg.cameras
        }
        self.steps = StepRing(keep=self.planner.lookback + 2 * math.ceil(self.hz) + 16)
        rig.keep_s = self.steps.keep / self.hz
        self.reader = StepReader(self.steps, RigFrames(rig))
        self.limits = ChunkLimits.for_robot(cfg)
        self.kernel: Kernel | None = None
        self.tick = 0
        self.due: dict[int, list[Callable[[], None]]] = {}
        self._wep = ""
        self._prev_act: int | None = None
        self.on_chunk: Callable[[Chunk], None] | None = None  # told each chunk answered

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
            inputs = assemble(window, lambda s, k: self._value(wep, s, k))
            self._prev_act = step
            rtc = rtc_request(ask.rtc, self.actions, self.hz, self.limits.dim)
            inputs = self.host.inputs(inputs["steps"], inputs["observations"])
            answer = self.host.infer(inputs, wep, rtc=rtc)
            rows = prepare(answer, self.actions, self.hz, self.limits)
            outcome: Chunk | str = Chunk(ask.id, wep, step, rows)
        except Exception as exc:  # a failing policy is an act failure, never a crash
            outcome = f"act failed: {type(exc).__name__}: {exc}"
        if self.on_chunk is not None and isinstance(outcome, Chunk):
            self.on_chunk(outcome)
        delay = self._delay(time.perf_counter() - started)
        self.acts += 1
        if delay == 0:
            if isinstance(outcome, Chunk):
                return outcome
            self._arrive(ask.id, outcome)
            return None
        self.due.setdefault(self.tick + delay, []).append(lambda: self._arrive(ask.id, outcome))
        return None

    def _value(self, wep: str, step: int, key: str) -> Any:
        """One key of the window, a camera frame as the worker would decode it."""
        value = self.reader.value(wep, step, key)
        cam = self.cameras.get(key)
        if cam is None:
            return value
        return decode(to_wire(fit_and_encode(value, cam, name=key)), cam.layout, name=key)

    def _delay(self, measured_s: float) -> int:
        """Ticks the act takes: none in sync (the world waits), else ceil(latency * hz)."""
        if self.sync:
            return 0
        given = self.latency_s
        latency = measured_s if given is None else given(self.acts) if callable(given) else given
        if not (math.isfinite(latency) and latency >= 0):
            raise ValueError(f"run_virtual: act {self.acts} has latency {latency!r} s")
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
