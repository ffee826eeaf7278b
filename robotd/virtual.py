"""The virtual-clock runner: the whole control loop in one process, without wall time.

:func:`run_virtual` drives the real :class:`~robotd.control.kernel.Kernel` tick by tick on a
virtual clock (integer ns; tick ``i`` is at ``t0 + round(i * 1e9 / hz)``), with the simulated
world in process memory (``SimWorld.local``), the sim arm on that clock and the sim cameras
rendered (``drivers.sim.render``) at their own capture times: a camera at ``fps`` shows, at
time ``now``, the frame captured at the newest ``t0 + k / fps <= now`` (the arm's pose and the
dot at that instant). Frames are rendered only when a policy window reads them.

Asks are answered in process, as the main process does on the wall clock: the window is
planned from the policy's declared observations (``WindowPlanner``), assembled from a ring of
the kernel's step records, and handed to ``policy.infer`` (``policy.reset()`` before each
worker-side episode's first act). Timing (SPEC §5):

- sync: the world waits; the chunk is merged at the ask's own tick, no tick passes.
- realtime: the act takes ``ceil(latency * hz)`` ticks, and those ticks RUN (the queue plays
  or holds) before the chunk is merged at the start of the tick it arrives on. The latency is
  fixed (``latency_s``, or ``control.latency_s``) or, when neither is set, measured: the wall
  time of the ``infer`` call.

With a fixed latency a run is a pure function of (config, policy, steps, seed): the same
seed gives the same played rows, bit for bit. A failed act (infer raises or answers badly)
is reported to the kernel at the tick its answer would have arrived, as ``act_failed``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from drivers.base import DriverContext
from drivers.sim import render as sim_render
from drivers.sim.arm import SimArm
from drivers.sim.world import SimWorld
from robotd.config import Config
from robotd.contract import Actions
from robotd.control.counters import AskLatency
from robotd.control.episode import State
from robotd.control.kernel import Chunk, Kernel
from robotd.link.session import StepRing, resample
from robotd.link.windows import WindowPlanner, assemble
from robotd.worker.policy_host import PolicyHost, PolicyLoadError

T0_NS = 1_000_000_000  # the virtual clock's origin (any int works; 1 s keeps it clear of 0)


class VirtualClock:
    """A settable ns clock: call it for the present time."""

    def __init__(self, now_ns: int) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns


@dataclass
class VirtualResult:
    """What a virtual run did, tick by tick and in summary.

    played: (ticks, dim) target written each tick (NaN where nothing was written);
    held: the kernel held this tick (a step with nothing to play, or a rejected row);
    running: an episode step was made this tick; tracking: the tip's distance to the dot at
    the tick (ground truth, before the tick's write).
    tracking_mean / tracking_p95 / holds / max_jump are over the running ticks; max_jump is
    the largest per-tick |Δ target| over the NON-gripper joints (a gripper's command is
    discrete by nature and is never blended nor averaged, so its jumps would only hide the
    arm's seams). counters: the kernel's, queue's and shield's counters and ask_latency.
    """

    played: np.ndarray
    held: np.ndarray
    running: np.ndarray
    tracking: np.ndarray
    tracking_mean: float
    tracking_p95: float
    holds: int
    max_jump: float
    outcome: str
    counters: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)


class _Cameras:
    """The sim cameras on the virtual clock: the newest capture index per camera, the arm's
    pose at each capture, and frames rendered on demand from those."""

    def __init__(self, cfg: Config, world: SimWorld) -> None:
        self.world = world
        self.keep_s = 4.0  # how far back captures stay readable; see retain()
        self.specs: dict[str, tuple[str, int, int, float]] = {}
        for name, cam in cfg.cameras.items():
            if cam.driver != "sim":
                raise ValueError(
                    f"run_virtual: cameras.{name}.driver is {cam.driver!r}; the "
                    "virtual clock renders sim cameras only"
                )
            view = str(cam.options.get("view", "top"))
            if view not in sim_render.VIEWS:
                raise ValueError(
                    f"run_virtual: cameras.{name}.options.view {view!r} is not one "
                    f"of {sim_render.VIEWS}"
                )
            self.specs[name] = (view, cam.width, cam.height, cam.fps)
        self.newest: dict[str, int] = {}
        self.poses: dict[str, dict[int, tuple[int, np.ndarray]]] = {n: {} for n in self.specs}

    def retain(self, seconds: float) -> None:
        """Keep every capture of the last `seconds` (what the step ring can still name)."""
        self.keep_s = seconds

    def capture_time(self, name: str, k: int) -> int:
        return self.world.t0_ns + round(k * 1e9 / self.specs[name][3])

    def newest_index(self, name: str, now: int) -> int:
        """The largest k with capture_time(k) <= now."""
        fps = self.specs[name][3]
        k = max(0, int((now - self.world.t0_ns) * fps / 1e9))
        while self.capture_time(name, k + 1) <= now:  # float rounding at the edges
            k += 1
        while k > 0 and self.capture_time(name, k) > now:
            k -= 1
        return k

    def advance(self, now: int, clock: VirtualClock, arm: SimArm) -> dict[str, tuple[int, int]]:
        """Capture each camera's newest frame at its own capture time (the arm integrated to
        it); returns the frame references the kernel records: name -> (index, capture ns)."""
        refs = {}
        for name in self.specs:
            k = self.newest_index(name, now)
            t = self.capture_time(name, k)
            if self.newest.get(name) != k:
                clock.now_ns = t
                arm.sync()  # integrates the arm to t and publishes it to the world
                poses = self.poses[name]
                poses[k] = (t, self.world.snapshot()[0])
                oldest = k - math.ceil(self.keep_s * self.specs[name][3]) - 1
                while next(iter(poses)) < oldest:  # ascending: captures come in order
                    del poses[next(iter(poses))]
                self.newest[name] = k
            refs[name] = (k, t)
        clock.now_ns = now
        return refs

    def frame(self, name: str, ref: Any) -> np.ndarray:
        if ref is None:
            raise LookupError(f"camera {name!r} had no frame at that step")
        got = self.poses[name].get(int(ref[0]))
        if got is None:
            raise LookupError(f"camera {name!r} frame {int(ref[0])} is no longer held")
        t, q = got
        view, width, height, _ = self.specs[name]
        image = sim_render.render(view, width, height, q, (t - self.world.t0_ns) / 1e9)
        image.flags.writeable = False  # as off the wire: the policy must copy to modify
        return image


class _Asker:
    """Answers the kernel's asks in process; schedules realtime answers `latency` ticks on."""

    def __init__(self, cfg: Config, policy: Any, cameras: _Cameras, latency_s: float | None):
        self.cameras = cameras
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
        cameras.retain(self.steps.keep / self.hz)
        self.kernel: Kernel | None = None
        self.tick = 0
        self.due: dict[int, list[Callable[[], None]]] = {}
        self._wep = ""
        self._prev_act: int | None = None

    def _lookup(self, wep: str) -> Callable[[int, str], Any]:
        def lookup(step: int, key: str) -> Any:
            rec = self.steps.get(wep, step)
            if rec is None:
                raise LookupError(f"step {step} of episode {wep} is no longer held")
            if key in self.cameras.specs:
                return self.cameras.frame(key, rec["cams"].get(key))
            if key in ("joints.pos", "joints.vel"):
                value = np.asarray(rec["pos" if key == "joints.pos" else "vel"], np.float64)
                value.flags.writeable = False
                return value
            raise LookupError(f"unknown observation key {key!r}")

        return lookup

    def __call__(self, ask: dict[str, Any]) -> Chunk | None:
        wep, step, ask_id = str(ask["wep"]), int(ask["s"]), int(ask["id"])
        if wep != self._wep:
            self._wep, self._prev_act = wep, None
        started = time.perf_counter()
        try:
            self.host.begin(wep)  # reset() on a new episode
            window = assemble(self.planner.plan(step, self._prev_act), self._lookup(wep))
            self._prev_act = step
            inputs = self.host.inputs(window["steps"], window["observations"])
            rows = self.host.infer(inputs, wep)
            outcome: Chunk | str = Chunk(ask_id, wep, step, self._to_control_rate(rows))
        except Exception as exc:  # a failing policy is an act failure, never a crash
            outcome = f"act failed: {type(exc).__name__}: {exc}"
        delay = self._delay(time.perf_counter() - started)
        if delay == 0:
            if isinstance(outcome, Chunk):
                return outcome
            self._arrive(ask_id, outcome)
            return None
        self.due.setdefault(self.tick + delay, []).append(lambda: self._arrive(ask_id, outcome))
        return None

    def _to_control_rate(self, rows: np.ndarray) -> np.ndarray:
        if self.actions is not None and self.actions.hz:
            return resample(rows, self.actions.hz, self.hz)
        return rows

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


def _prepare(cfg: Config, aligned: bool) -> Config:
    if cfg.joints.driver != "sim":
        raise ValueError(
            f"run_virtual: joints.driver is {cfg.joints.driver!r}; the virtual "
            "clock drives the sim arm only"
        )
    return cfg.model_copy(update={"control": cfg.control.model_copy(update={"aligned": aligned})})


def _start(kernel: Kernel, actions: Actions | None) -> None:
    """Hand the kernel the action contract and get an episode running, whatever the
    configured start (a virtual run has no operator)."""
    kernel.set_contract(actions.open_loop_horizon if actions is not None else None)
    if kernel.machine.state is State.FAULT:
        kernel.command("clear_fault", {})
    if kernel.machine.state is State.IDLE:
        kernel.command("start", {})


def run_virtual(
    cfg: Config,
    policy: Any,
    *,
    steps: int,
    latency_s: float | None = None,
    seed: int = 0,
    aligned: bool = True,
) -> VirtualResult:
    """Run `steps` control ticks of `cfg` (sim arm and sim cameras) with `policy` on the
    virtual clock; see the module docstring for the timing rules.

    latency_s: the fixed policy latency in seconds; None takes ``control.latency_s`` and, if
    that is unset too, measures each infer call's wall time (then runs are not reproducible).
    seed: the sim arm's read-noise seed. aligned: False plays realtime chunks from their start
    (the naive baseline; overrides ``control.aligned``). Raises ValueError for a config it
    cannot simulate, TypeError for an object without the policy API.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"run_virtual: steps must be an integer >= 1, got {steps!r}")
    if latency_s is not None and not (math.isfinite(latency_s) and latency_s >= 0):
        raise ValueError(f"run_virtual: latency_s must be a finite number >= 0, got {latency_s!r}")
    cfg = _prepare(cfg, aligned)
    clock = VirtualClock(T0_NS)
    world = SimWorld.local(len(cfg.joints.names), T0_NS)
    options = SimArm.Options.model_validate({**cfg.joints.options, "seed": seed})
    arm = SimArm(cfg.joints.names, options, DriverContext(clock=clock), world=world)
    arm.open()
    arm.torque(True)  # as the control process: hold where the joints are from the start
    cameras = _Cameras(cfg, world)
    asker = _Asker(cfg, policy, cameras, cfg.control.latency_s if latency_s is None else latency_s)
    events: list[dict[str, Any]] = []

    def emit(msg: dict[str, Any]) -> None:
        if msg["k"] == "step":
            asker.steps.add(msg)
        elif msg["k"] == "event":
            events.append(msg)

    kernel = Kernel(cfg, run_id="virtual", emit=emit, asker=asker)
    asker.kernel = kernel
    _start(kernel, asker.actions)
    trace = _Trace(steps, len(cfg.joints.names))
    torque = True
    for tick in range(steps):
        now = T0_NS + round(tick * 1e9 / cfg.control.hz)
        asker.deliver_due(tick)
        frames = cameras.advance(now, clock, arm)
        joints = arm.read()
        truth = arm.ground_truth()
        holds, made = kernel.counters.holds, kernel.counters.steps
        target = kernel.update(now, joints, frames, truth)
        if kernel.torque_on != torque:
            torque = kernel.torque_on
            arm.torque(torque)
        if target is not None:
            arm.write(target)
        trace.record(
            tick,
            target,
            kernel.counters.holds > holds,
            kernel.counters.steps > made,
            truth["tracking_error"],
        )
    arm.close()
    world.close()
    return trace.result(kernel, cfg, events)


class _Trace:
    """Per-tick records of a virtual run and the summary figures made from them."""

    def __init__(self, ticks: int, dim: int) -> None:
        self.played = np.full((ticks, dim), np.nan)
        self.held = np.zeros(ticks, dtype=bool)
        self.running = np.zeros(ticks, dtype=bool)
        self.tracking = np.zeros(ticks)

    def record(
        self, tick: int, target: np.ndarray | None, held: bool, running: bool, tracking: float
    ) -> None:
        if target is not None:
            self.played[tick] = target
        self.held[tick] = held
        self.running[tick] = running
        self.tracking[tick] = tracking

    def max_jump(self, grippers: tuple[int, ...]) -> float:
        arm_dims = [d for d in range(self.played.shape[1]) if d not in grippers]
        both = self.running[1:] & self.running[:-1]
        jumps = np.abs(np.diff(self.played[:, arm_dims], axis=0))[both]
        jumps = jumps[np.isfinite(jumps).all(axis=1)]
        return float(jumps.max()) if jumps.size else 0.0

    def result(self, kernel: Kernel, cfg: Config, events: list[dict[str, Any]]) -> VirtualResult:
        tracking = self.tracking[self.running]
        counters = kernel.stats()
        counters["ask_latency"] = AskLatency.from_wire(counters["ask_latency"]).summary()
        return VirtualResult(
            played=self.played,
            held=self.held,
            running=self.running,
            tracking=self.tracking,
            tracking_mean=float(tracking.mean()) if tracking.size else 0.0,
            tracking_p95=float(np.percentile(tracking, 95)) if tracking.size else 0.0,
            holds=int((self.held & self.running).sum()),
            max_jump=self.max_jump(cfg.joints.gripper_indices()),
            outcome=kernel.machine.outcome,
            counters=counters,
            events=events,
        )
