"""The virtual-clock runner: the whole control loop in one process, without wall time.

:func:`run_virtual` drives the real kernel through the same tick as the control process
(robotd.control.tick.TickIO: read → frame refs → update → torque → write) on a virtual
clock (integer ns; tick ``i`` is at ``t0 + round(i * 1e9 / hz)``), with the simulated robot
in process memory (drivers.sim.virtual.VirtualRig: the sim arm on that clock, the sim
cameras rendered at their own capture times, only when a policy window reads them).

Asks are answered in process (robotd.virtual.asker), as the main process answers them on
the wall clock. With a fixed latency a run is a pure function of (config, policy, steps,
seed): the same seed gives the same played rows, bit for bit. A failed act (infer raises or
answers badly) is reported to the kernel at the tick its answer would have arrived. With
`trace_dir` the run is recorded as the daemon records one (robotd.virtual.trace), so that
`robotd replay` can check it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from drivers.base import CameraSpec
from drivers.sim.virtual import VirtualRig
from robotd.config import Config
from robotd.contract import Actions
from robotd.control.counters import AskLatency
from robotd.control.episode import State
from robotd.control.histogram import LatencyHistogram
from robotd.control.kernel import Kernel
from robotd.control.tick import TickIO
from robotd.lane.messages import Ask, Event, Merged, Step
from robotd.virtual.asker import VirtualAsker
from robotd.virtual.latency import LatencySchedule
from robotd.virtual.trace import VirtualTrace

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
    tracking_mean / tracking_p95 / holds / max_jump / mean_abs_jerk are over the running
    ticks; max_jump is the largest per-tick |Δ target| over the NON-gripper joints (a
    gripper's command is discrete by nature and is never blended nor averaged, so its jumps
    would only hide the arm's seams); mean_abs_jerk the mean |Δ³ target| · hz³ (rad/s³) over
    the same joints, where four running ticks follow each other; holds_after_first the
    ticks from the one the run's first chunk merged at on that had no row to play (the
    queue ran dry; a row the shield rejected is held too, but counted in `rejected`).
    counters: the kernel's, queue's and shield's counters and ask_latency. asks and merges:
    the lane's Ask and Merged messages, in order.
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
    events: list[Event] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    mean_abs_jerk: float = 0.0
    holds_after_first: int = 0
    asks: list[Ask] = field(default_factory=list)
    merges: list[Merged] = field(default_factory=list)
    trace_run: Path | None = None  # the run directory written (with trace_dir)


def _prepare(cfg: Config, aligned: bool) -> Config:
    if cfg.joints.driver != "sim":
        raise ValueError(
            f"run_virtual: joints.driver is {cfg.joints.driver!r}; the virtual "
            "clock drives the sim arm only"
        )
    for name, cam in cfg.cameras.items():
        if cam.driver != "sim":
            raise ValueError(
                f"run_virtual: cameras.{name}.driver is {cam.driver!r}; the virtual clock "
                "renders sim cameras only"
            )
    return cfg.model_copy(update={"control": cfg.control.model_copy(update={"aligned": aligned})})


def _start(kernel: Kernel, actions: Actions | None, rtc: bool) -> None:
    """Hand the kernel the action contract and get an episode running, whatever the
    configured start (a virtual run has no operator)."""
    kernel.set_contract(actions.open_loop_horizon if actions is not None else None, rtc)
    if kernel.machine.state is State.FAULT:
        kernel.command("clear_fault")
    if kernel.machine.state is State.IDLE:
        kernel.command("start")


def _rig(cfg: Config, clock: VirtualClock, seed: int) -> VirtualRig:
    cameras = {
        name: (CameraSpec(name, cam.width, cam.height, cam.fps), cam.options)
        for name, cam in cfg.cameras.items()
    }
    try:
        return VirtualRig(cfg.joints.names, cfg.joints.options, cameras, clock, seed=seed)
    except ValueError as exc:
        raise ValueError(f"run_virtual: {exc}") from None


def run_virtual(
    cfg: Config,
    policy: Any,
    *,
    steps: int,
    latency_s: float | LatencySchedule | None = None,
    seed: int = 0,
    aligned: bool = True,
    trace_dir: Path | str | None = None,
) -> VirtualResult:
    """Run `steps` control ticks of `cfg` (sim arm and sim cameras) with `policy` on the
    virtual clock; see the module docstring for the timing rules.

    latency_s: the fixed policy latency in seconds, or a schedule (act number -> seconds,
    robotd.virtual.latency); None takes ``control.latency_s`` and, if that is unset too,
    measures each infer call's wall time (then runs are not reproducible).
    seed: the sim arm's read-noise seed. aligned: False plays realtime chunks from their start
    (the naive baseline; overrides ``control.aligned``). trace_dir: record the run there.
    Raises ValueError for a config it cannot simulate, TypeError for an object without the
    policy API.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"run_virtual: steps must be an integer >= 1, got {steps!r}")
    fixed = latency_s is not None and not callable(latency_s)
    if fixed and not (math.isfinite(latency_s) and latency_s >= 0):  # type: ignore[arg-type]
        raise ValueError(f"run_virtual: latency_s must be a finite number >= 0, got {latency_s!r}")
    cfg = _prepare(cfg, aligned)
    clock = VirtualClock(T0_NS)
    rig = _rig(cfg, clock, seed)
    asker = VirtualAsker(
        cfg, policy, rig, cfg.control.latency_s if latency_s is None else latency_s
    )
    traced = None if trace_dir is None else VirtualTrace(cfg, clock, trace_dir, T0_NS)
    out = _Collected()
    kernel = Kernel(cfg, run_id="virtual", emit=out.sink(asker, traced), asker=asker)
    asker.kernel = kernel
    asker.on_chunk = traced.chunk if traced is not None else None
    rig.arm.open()
    io = TickIO(kernel, rig.arm, rig.refs, out.error)
    io.start()  # as the control process: hold where the joints are from the start
    _start(kernel, asker.actions, asker.host.takes_rtc)
    trace = _Trace(steps, len(cfg.joints.names))
    after_tick: Callable[[], None] = traced.flush if traced is not None else lambda: None
    after_tick()
    try:
        _ticks(cfg, steps, (clock, asker, rig, kernel, io), trace, after_tick)
    finally:
        rig.close()
        run_dir = traced.close() if traced is not None else None
    result = trace.result(kernel, cfg, out)
    result.trace_run = run_dir
    return result


def _ticks(cfg: Config, steps: int, parts: tuple[Any, ...], trace: _Trace,
           after_tick: Callable[[], None]) -> None:
    """The run's ticks (`parts`: clock, asker, rig, kernel, io), each told `trace`."""
    clock, asker, rig, kernel, io = parts
    for tick in range(steps):
        now = T0_NS + round(tick * 1e9 / cfg.control.hz)
        clock.now_ns = now
        asker.deliver_due(tick)
        rig.capture_until(now)
        holds, made = kernel.counters.holds, kernel.counters.steps
        rejected = kernel.shield.counters.rejected
        target = io.run(now)
        truth = rig.arm.ground_truth()
        held = kernel.counters.holds > holds
        trace.record(
            tick,
            target,
            held,
            kernel.counters.steps > made,
            truth["tracking_error"],
            starved=held and kernel.shield.counters.rejected == rejected,
        )
        if trace.first_chunk is None and kernel.counters.chunks:
            trace.first_chunk = tick
        after_tick()


class _Collected:
    """What the kernel emitted in a virtual run: events and step records (steps also feed
    the asker's ring); driver errors raise, as a virtual run has no hardware to blame."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.steps: list[Step] = []
        self.asks: list[Ask] = []
        self.merges: list[Merged] = []

    def sink(self, asker: VirtualAsker, traced: VirtualTrace | None = None) -> Any:
        def emit(msg: Any) -> None:
            if traced is not None:
                traced.emit(msg)
            if isinstance(msg, Step):
                asker.on_step(msg)
                self.steps.append(msg)
            elif isinstance(msg, Event):
                self.events.append(msg)
            elif isinstance(msg, Ask):
                self.asks.append(msg)
            elif isinstance(msg, Merged):
                self.merges.append(msg)

        return emit

    def error(self, op: str, exc: BaseException) -> None:
        raise RuntimeError(f"run_virtual: {op} failed: {exc}") from exc


class _Trace:
    """Per-tick records of a virtual run and the summary figures made from them."""

    def __init__(self, ticks: int, dim: int) -> None:
        self.played = np.full((ticks, dim), np.nan)
        self.held = np.zeros(ticks, dtype=bool)
        self.running = np.zeros(ticks, dtype=bool)
        self.starved = np.zeros(ticks, dtype=bool)
        self.tracking = np.zeros(ticks)
        self.first_chunk: int | None = None  # the tick the run's first chunk merged at

    def record(
        self,
        tick: int,
        target: np.ndarray | None,
        held: bool,
        running: bool,
        tracking: float,
        *,
        starved: bool = False,
    ) -> None:
        if target is not None:
            self.played[tick] = target
        self.held[tick] = held
        self.starved[tick] = starved
        self.running[tick] = running
        self.tracking[tick] = tracking

    def _arm_diff(self, grippers: tuple[int, ...], n: int) -> np.ndarray:
        """n-th differences of the arm joints' targets where n + 1 running ticks follow
        each other (rows with nothing written left out)."""
        arm_dims = [d for d in range(self.played.shape[1]) if d not in grippers]
        run = self.running
        both = np.ones(max(0, run.size - n), dtype=bool)
        for k in range(n + 1):
            both &= run[k : run.size - n + k]
        diffs = np.diff(self.played[:, arm_dims], n=n, axis=0)[both]
        return diffs[np.isfinite(diffs).all(axis=1)]

    def max_jump(self, grippers: tuple[int, ...]) -> float:
        jumps = np.abs(self._arm_diff(grippers, 1))
        return float(jumps.max()) if jumps.size else 0.0

    def mean_abs_jerk(self, grippers: tuple[int, ...], hz: float) -> float:
        jerk = np.abs(self._arm_diff(grippers, 3)) * hz**3
        return float(jerk.mean()) if jerk.size else 0.0

    def holds_after_first(self) -> int:
        if self.first_chunk is None:
            return 0
        after = np.arange(self.held.size) >= self.first_chunk
        return int((self.starved & self.running & after).sum())

    def result(self, kernel: Kernel, cfg: Config, out: _Collected) -> VirtualResult:
        tracking = self.tracking[self.running]
        counters = counters_of(kernel)
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
            events=out.events,
            steps=out.steps,
            mean_abs_jerk=self.mean_abs_jerk(cfg.joints.gripper_indices(), cfg.control.hz),
            holds_after_first=self.holds_after_first(),
            asks=out.asks,
            merges=out.merges,
        )


def counters_of(kernel: Kernel) -> dict[str, Any]:
    """The kernel's counters under the summary's names, with the ask latency summarised."""
    from robotd.lane.messages import Stats

    lat = kernel.playback.ask_latency
    empty = LatencyHistogram().data()
    stats = Stats(
        kernel.counters,
        kernel.playback.queue.counters,
        kernel.shield.counters,
        empty,
        empty,
        dict(lat.steps),
        lat.ns.data(),
        0,
        0,
        0.0,
        0,
        {},
        kernel.status(),
    )
    ask = AskLatency()
    ask.steps, ask.ns = dict(lat.steps), lat.ns
    return {**stats.totals(), "ask_latency": ask.summary()}
