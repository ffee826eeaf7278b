"""The kernel's state at an episode's start, out (`snapshot`) and back in (`restore`).

An operator-level episode starts from whatever the kernel held when `start` came: the
shield's anchor and last step, the playback's ask count and back-off, the contract, the
recent act delays the next one is predicted from, the fault latch, a pending skip.
`snapshot` puts that in a `StartState` lane message (the kernel emits it just before
`episode_start`, so the trace holds it); `restore` puts it back into a fresh kernel built
from the same config, so that a replay (robotd.trace.replay) runs the episode's ticks
through the same code from the same state.

This module is the one place that reads and sets those parts of the kernel, the shield and
the playback from outside them: anything added to them that outlives an episode's start
must be added here (and to `StartState`), or a replay will say the targets differ.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from robotd.control.counters import Counters
from robotd.control.episode import EpisodeMachine, State
from robotd.control.latch import FaultLatch
from robotd.control.playback import Playback
from robotd.control.record import StepRecorder
from robotd.control.shield import Shield
from robotd.control.watchdog import Watchdog
from robotd.lane.messages import StartState


class Kernel(Protocol):
    """The parts of robotd.control.kernel.Kernel held here (named, not imported: the
    kernel imports this module, through robotd.control.lifecycle)."""

    run_id: str
    dim: int
    wep: str
    step: int
    task: str
    counters: Counters
    machine: EpisodeMachine
    latch: FaultLatch
    shield: Shield
    playback: Playback
    recorder: StepRecorder
    watchdog: Watchdog
    _wep_n: int
    _skip: int
    _driver_fail_run: int
    _autostart: bool


def _vector(a: np.ndarray | None) -> list[float] | None:
    return None if a is None else [float(x) for x in a]


def snapshot(kernel: Kernel) -> StartState:
    """The kernel's state now (just after an episode started: RUNNING, step 0)."""
    sh, pb, latch = kernel.shield, kernel.playback, kernel.latch
    return StartState(
        ep=kernel.machine.episode,
        wep=kernel.wep,
        run_id=kernel.run_id,
        wep_n=kernel._wep_n,
        tick=kernel.counters.ticks,
        last=_vector(sh._last),
        last_step=_vector(sh._prev_step),
        rejections=sh._run,
        ask_id=pb._ask_id,
        retry_at=pb._retry_at_tick,
        open_loop_horizon=pb.queue.cfg.open_loop_horizon,
        torque=latch.torque_on,
        anchored=latch.anchored,
        skip=kernel._skip,
        read_failures=kernel._driver_fail_run,
        task=kernel.task[:2000],
        rtc=pb.rtc,
        delays=list(pb.delay._recent),
    )


def _array(values: list[float] | None, dim: int, what: str) -> np.ndarray | None:
    if values is None:
        return None
    if len(values) != dim:
        raise ValueError(f"start state: {what} has {len(values)} joints, the config {dim}")
    return np.asarray(values, dtype=np.float64)


def restore(kernel: Kernel, state: StartState) -> None:
    """Put a fresh kernel (same config, `run_id` = state.run_id, no tick run yet) into
    `state`, an episode running at its step 0. ValueError if the state does not fit the
    kernel's config."""
    if state.run_id != kernel.run_id:
        raise ValueError(f"start state: run id {state.run_id!r}, the kernel's {kernel.run_id!r}")
    last = _array(state.last, kernel.dim, "the shield's anchor")
    last_step = _array(state.last_step, kernel.dim, "the shield's last step")
    kernel._autostart = False
    kernel.playback.configure(state.open_loop_horizon, state.rtc)
    pb = kernel.playback
    pb._ask_id, pb._retry_at_tick = state.ask_id, state.retry_at
    for d in state.delays:  # the prediction is a function of them, in order
        pb.delay.add(d)
    sh = kernel.shield
    sh._last, sh._prev_step, sh._run = last, last_step, state.rejections
    m = kernel.machine
    m.state, m.episode, m.outcome, m.fault = State.RUNNING, state.ep, "", None
    kernel.latch.torque_on, kernel.latch.anchored = state.torque, state.anchored
    kernel.counters.ticks = state.tick
    kernel.counters.episodes = 1
    kernel._wep_n, kernel.wep, kernel.step = state.wep_n, state.wep, 0
    kernel._skip, kernel._driver_fail_run = state.skip, state.read_failures
    kernel.task = state.task
    kernel.recorder.reset()
    kernel.watchdog.reset()
