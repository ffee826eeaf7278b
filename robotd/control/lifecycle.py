"""The kernel's state and what changes it between ticks: the episode lifecycle.

Everything here happens outside the per-tick update (robotd.control.kernel): an operator
command (start, stop, estop, clear_fault, reset_done, status), the main process's messages
(the worker's contract, a chunk, a failed act, a lost worker episode), and the episode
starts, ends and faults they and the tick cause. The state lives here too, built in one
place: the episode machine and fault latch, the playback and the shield, and the counters
every status and summary reads. Kernel adds the tick on top: the tick calls in here (to
end an episode, latch a fault, emit an event) and nothing here calls the tick.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from robotd.config import Config
from robotd.control import gate, resume
from robotd.control.counters import Counters
from robotd.control.episode import CommandRefused, EpisodeMachine, State
from robotd.control.latch import FaultLatch
from robotd.control.playback import Chunk, playback_for
from robotd.control.record import StepRecorder
from robotd.control.shield import Shield
from robotd.control.watchdog import Watchdog
from robotd.lane.messages import UNDO_ESTOP, Ask, Event, Status

Emit = Callable[[Any], None]
Asker = Callable[[Ask], Chunk | None]
ESTOP_STOP_S = 0.5  # category 1: hold this long (a controlled stop), then torque off


def _shield(cfg: Config, dt: float) -> Shield:
    s = cfg.safety
    return Shield(
        list(cfg.joints.names),
        np.asarray(cfg.joints.lower),
        np.asarray(cfg.joints.upper),
        clip_tolerance=s.clip_tolerance,
        dt=dt,
        max_velocity=None if s.max_velocity is None else np.asarray(s.max_velocity),
        max_acceleration=None if s.max_acceleration is None else np.asarray(s.max_acceleration),
        reject_run=s.reject_run,
    )


class Lifecycle:
    """The kernel's state, the commands and messages that change it between ticks, and the
    episode starts, ends and faults. Kernel (robotd.control.kernel) is this plus the tick.

    `asker`: the virtual runner answers asks at once (a chunk, or None when the answer
    comes later through `deliver`); the wall-clock lane only emits them.
    """

    def __init__(self, cfg: Config, *, run_id: str, emit: Emit, asker: Asker | None = None):
        self.cfg = cfg
        self.run_id = run_id
        self.emit = emit
        self._asker = asker
        self.dim = len(cfg.joints.names)
        self.dt = 1.0 / cfg.control.hz
        self.counters = Counters()
        self.machine = EpisodeMachine(cfg.robot.start)
        self.latch = FaultLatch(
            self.machine,
            estop_category=cfg.safety.estop_category,
            stop_ticks=int(ESTOP_STOP_S / self.dt),
            event=self._event,
        )
        self.shield = _shield(cfg, self.dt)
        self.playback = playback_for(cfg, dt=self.dt, counters=self.counters, emit=emit)
        self.recorder = StepRecorder(
            {name: int(cam.max_age_ms * 1e6) for name, cam in cfg.cameras.items()}, self.counters
        )
        self.watchdog = Watchdog(cfg.control.max_hold_steps)
        self.step = 0  # step within the worker-side episode (what asks and rows count by)
        self._ep_steps0 = 0  # counters.steps when the operator episode started
        self.wep = ""  # worker-side episode id
        self.task = ""  # the operator's task text for the episode
        self._estop_ns = 0  # the latest e-stop taken or fault latched (robotd.control.gate)
        self._wep_n = 0
        self._said = 0  # states said (Status.seq)
        self._grippers = list(cfg.joints.gripper_indices())
        self._mode = cfg.control.control_mode
        self._end_after_tick = ""  # an outcome decided mid-tick, applied once the step counts
        self._skip = 0  # steps to skip before this tick's own (overruns, failed reads)
        self._driver_fail_run = 0
        self._now_ns = 0
        self._shield_outcome = ""
        self._since_reset: tuple[int, int] | None = None  # (holds, ns) at the last reset
        # A simulated robot starts its first episode by itself, once the policy link is up.
        self._autostart = cfg.robot.start == "episode"

    @property
    def episode_steps(self) -> int:
        """The operator episode's steps so far (status, episode_end): unlike `step`, never
        back to 0 at a worker-side reset within it."""
        return self.counters.steps - self._ep_steps0

    @property
    def torque_on(self) -> bool:
        return self.latch.torque_on

    # ---- commands and messages from the main process --------------------------------------

    def command(
        self, cmd: str, reason: str = "", task: str = "", sent_ns: int = 0, *,
        expires_ns: int = 0, now_ns: int = 0,
    ) -> Status:  # fmt: skip
        """Apply an operator command; returns the status or raises CommandRefused.
        `sent_ns`: when the operator's request was taken, `expires_ns` when its client stops
        waiting, `now_ns` now (CLOCK_MONOTONIC, 0: unknown): a command that would move the
        robot again is refused when taken before the latest e-stop or arriving after its
        client gave up (robotd.control.gate)."""
        m = self.machine
        if cmd in UNDO_ESTOP:
            gate.undo_allowed(cmd, sent_ns, self._estop_ns, expires_ns, now_ns)
        if cmd == "estop":
            self._estop_ns = max(self._estop_ns, sent_ns)
            self.fault("estop", reason or "operator e-stop")
        elif cmd == "clear_fault":
            self.latch.clear()
        elif cmd == "start":
            m.start()
            self.task = task
            self._start_episode(already_started=True)
        elif cmd == "stop":
            if not self._end_episode("stopped"):
                raise CommandRefused("bad_state", f"stop needs RUNNING, state is {m.state}")
        elif cmd == "reset_done":
            m.reset_done()
            self._event("reset_done")
        elif cmd != "status":
            raise CommandRefused("unknown_command", f"the control lane has no command {cmd!r}")
        return self.status()

    def status(self) -> Status:
        m, pb = self.machine, self.playback
        left = self.latch.torque_off_in(self.counters.ticks)
        self._said += 1
        # `step`: the operator episode's (it only grows while the episode runs)
        return Status(
            str(m.state), m.episode, self.wep, self.episode_steps, m.outcome, self.latch.shown(),
            len(pb.queue), pb.in_flight is not None, self.latch.torque_on, self.task,
            self.recorder.stale if m.state is State.RUNNING else (),
            None if left is None else round(left * self.dt, 3), self._said, max(0, self.step),
        )

    def set_contract(
        self, open_loop_horizon: int | None, rtc: bool = False, ready: bool = True
    ) -> None:
        """The worker's action contract: sync plays at most this many rows of a chunk;
        `rtc`: the policy takes each act's frozen prefix, which the merge then keeps;
        `ready`: the policy answers acts now (robot.start = "episode" starts at the first
        ready contract)."""
        self.playback.configure(open_loop_horizon, rtc)
        self._event("contract", open_loop_horizon=open_loop_horizon, rtc=rtc, ready=ready)
        if self._autostart and ready:
            self._autostart = False
            if self.machine.state is State.IDLE:  # not after an e-stop taken before the link
                self._start_episode()

    def deliver(self, chunk: Chunk) -> None:
        """A chunk arrived; it is merged at the start of the next update."""
        self.playback.deliver(chunk)

    def act_failed(self, ask_id: int, reason: str) -> None:
        if self.playback.failed(ask_id, self.counters.ticks):
            self._event("act_failed", reason=reason, ask=ask_id)

    def episode_lost(self, cause: str) -> None:
        """The worker's copy of the policy is gone: go on in a new worker-side episode."""
        if self.machine.state is not State.RUNNING:
            return
        self.counters.episode_resets += 1
        queue = self.playback.queue
        keep = queue.peek().copy() if self.cfg.control.on_reset == "finish_chunk" else None
        old = self.wep
        flushed = self._new_worker_episode(keep_seam=True)
        if keep is not None and len(keep):
            # Let the queued rows finish: they become rows of the new episode from its step 0.
            self.playback.queue.merge(keep, 0, 0)
            flushed = 0
        self._event("episode_reset", cause=cause, old_wep=old, new_wep=self.wep, flushed=flushed)
        self._since_reset = (self.counters.holds, self._now_ns)

    # ---- episodes --------------------------------------------------------------------------

    def _start_episode(self, already_started: bool = False) -> None:
        if not already_started:
            self.machine.start()
        self.counters.episodes += 1
        self._ep_steps0 = self.counters.steps
        self.watchdog.reset()
        self._new_worker_episode()
        self.emit(resume.snapshot(self))  # what a replay of the episode starts from
        self._event("episode_start", episode=self.machine.episode, wep=self.wep)

    def _new_worker_episode(self, *, keep_seam: bool = False) -> int:
        self._wep_n += 1
        self.wep = f"{self.run_id}-{self._wep_n}"
        self.step = 0
        self.recorder.reset()
        return self.playback.reset(keep_seam=keep_seam)

    def _end_episode(self, outcome: str) -> bool:
        if not self.machine.end(outcome):
            return False
        self._episode_ended(outcome)
        return True

    def _episode_ended(self, outcome: str, cause: str = "") -> None:
        flushed = self.playback.reset()
        m = self.machine
        self._event(
            "episode_end",
            episode=m.episode,
            wep=self.wep,
            outcome=outcome,
            cause=cause,  # a fault's cause (a replay tells the operator's from the kernel's)
            steps=self.episode_steps,
            wep_steps=self.step,  # of its last worker-side episode
            flushed=flushed,
        )

    def fault(self, cause: str, detail: str) -> None:
        """Latch FAULT; a running episode ends as 'fault' with its queue flushed (which is
        also what makes a safety cause gone: nothing of the offending chunk remains)."""
        if self.machine.state is State.RUNNING:
            self._episode_ended("fault", cause)
        self.latch.latch(cause, detail, self.counters.ticks)
        # a clear_fault or start sent before this fault (the lane's own too) must not undo it
        self._estop_ns = max(self._estop_ns, time.monotonic_ns())

    def _event(self, name: str, **detail: Any) -> None:
        self.emit(Event(name, self.counters.ticks, detail))
