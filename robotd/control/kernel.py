"""The control kernel: one tick's update between reading and writing the joints.

read (robotd.control.tick) → record step s → merge any chunk that arrived → ask if the
queue runs low → pop the next row or hold → shield → target to write (robotd.control.tick).

It owns the episode state (EpisodeMachine and FaultLatch), the action queue (Playback)
and the shield, and knows nothing of clocks, sockets or processes: the control process
drives it from its ticker and ZeroMQ sockets, the virtual-clock runner step by step.
Everything it tells the outside world goes through `emit(message)` as a typed lane
message (robotd.lane.messages).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from drivers.base import JointState
from robotd.config import Config
from robotd.control import gate, resume
from robotd.control.counters import Counters
from robotd.control.episode import CommandRefused, EpisodeMachine, State
from robotd.control.latch import FaultLatch
from robotd.control.playback import Chunk, playback_for
from robotd.control.record import StepRecorder
from robotd.control.shield import REJECTED, Shield
from robotd.control.watchdog import Watchdog
from robotd.lane.messages import UNDO_ESTOP, Ask, Event, FrameRef, Status

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


class Kernel:
    """Per-tick control logic; see the module docstring for the order of work.

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

    def set_contract(self, open_loop_horizon: int | None, rtc: bool = False) -> None:
        """The worker's action contract: sync plays at most this many rows of a chunk;
        `rtc`: the policy takes each act's frozen prefix, which the merge then keeps."""
        self.playback.configure(open_loop_horizon, rtc)
        self._event("contract", open_loop_horizon=open_loop_horizon, rtc=rtc)
        if self._autostart:
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

    # ---- the tick --------------------------------------------------------------------------

    def update(
        self,
        now_ns: int,
        joints: JointState | None,
        frames: Mapping[str, FrameRef | None],
        truth: dict[str, float] | None = None,
        skipped: int = 0,
    ) -> np.ndarray | None:
        """One tick. `joints` None means the read failed this tick; `skipped` counts the
        deadlines the ticker skipped just before it (an overrun). Returns the target to
        write, or None when nothing may be written (torque off or no joint state yet)."""
        self.counters.ticks += 1
        self._now_ns = now_ns
        self._skip += skipped
        # before the read's outcome: a category-1 e-stop's torque-off comes on time even
        # when every read fails (a bus gone), never held back by the failures
        self.latch.tick(self.counters.ticks)
        if joints is None:
            self._skip += 1  # a tick without a read is a step nothing was read at
            return self._driver_trouble()
        self._driver_fail_run = 0
        if not self.latch.anchored:
            self.shield.reset(joints.position)
            self.latch.anchored = True
        self.latch.cause_gone("driver")
        if self.machine.state is State.ENDED:
            self.machine.begin_reset()
        if self.machine.state is not State.RUNNING:
            self._skip = 0
            return self._held(None)
        if self._skip and not self._skip_steps():
            return self._held(None)
        return self._episode_step(now_ns, joints, frames, truth)

    def _episode_step(
        self,
        now_ns: int,
        joints: JointState,
        frames: Mapping[str, FrameRef | None],
        truth: dict[str, float] | None,
    ) -> np.ndarray | None:
        """Record the step, merge, maybe ask, play or hold, and count the step."""
        m = self.machine
        rec = self.recorder.record(
            episode=m.episode,
            wep=self.wep,
            step=self.step,
            now_ns=now_ns,
            joints=joints,
            frames=frames,
            truth=truth,
        )
        if not rec.ok:
            self.counters.invalid_observations += 1
        self.emit(rec)
        pb = self.playback
        pb.merge_pending(wep=self.wep, step=self.step, now_ns=now_ns)
        if rec.ok and pb.should_ask(self.counters.ticks, self.step):
            self._ask()
        self._shield_outcome = ""
        row = pb.pop(self.step)
        if row is not None and self._since_reset is not None:
            self._resumed(now_ns)
        target = self._play(row) if row is not None else self._held(self.step)
        if self._mode == "absolute" and target is not None:
            pb.queue.commanded(target)
        rec.target = None if target is None else target.tolist()
        rec.held = row is None or self._shield_outcome == REJECTED
        rec.shield = self._shield_outcome  # type: ignore[assignment]
        self.step += 1
        self.counters.steps += 1
        limit = self.cfg.control.max_steps
        if self._end_after_tick:
            self._end_episode(self._end_after_tick)
            self._end_after_tick = ""
        elif limit and self.step >= limit:
            self._end_episode("max_steps")
        return target

    # ---- pieces of the tick ----------------------------------------------------------------

    def _resumed(self, now_ns: int) -> None:
        """The first row of the episode after a reset plays: how long the robot held."""
        assert self._since_reset is not None
        holds, reset_ns = self._since_reset
        self._since_reset = None
        held = self.counters.holds - holds
        c = self.counters
        c.max_holds_after_reset = max(c.max_holds_after_reset, held)
        after_ms = round((now_ns - reset_ns) / 1e6, 1)
        self._event("resumed", held_ticks=held, t_ns=now_ns, after_ms=after_ms)

    def _skip_steps(self) -> bool:
        """Steps are ticks of the wall clock: an overrun's skipped deadlines are steps too, so
        rows keep their meant-for time (the queue drops the passed ones). Nothing was read at
        them; each repeats the last record, marked skipped. False when the skipped steps
        reached max_steps and ended the episode."""
        n, self._skip = self._skip, 0
        limit = self.cfg.control.max_steps
        for _ in range(n):
            rec = self.recorder.skipped(self.step)
            if rec is not None:
                self.emit(rec)
            self.step += 1
            self.counters.steps += 1
            self.counters.skipped_steps += 1
            if limit and self.step >= limit:
                self._end_episode("max_steps")
                return False
        return True

    def _ask(self) -> None:
        ask = self.playback.ask(
            wep=self.wep, step=self.step, episode=self.machine.episode, now_ns=self._now_ns
        )
        self.emit(ask)
        if self._asker is not None:
            chunk = self._asker(ask)
            if chunk is not None:
                self.playback.deliver(chunk)
                self.playback.merge_pending(wep=self.wep, step=self.step, now_ns=self._now_ns)

    def _play(self, row: np.ndarray) -> np.ndarray | None:
        if self._mode != "absolute":
            # Arm joints move by the row (delta, or velocity × dt); grippers are commanded
            # absolutely in every mode, as policies trained on delta actions expect.
            step = row if self._mode == "delta" else row * self.dt
            absolute = row
            row = self.shield.last + step
            row[self._grippers] = absolute[self._grippers]
        verdict = self.shield.check(row)
        self._shield_outcome = "" if verdict.outcome == "ok" else verdict.outcome
        if verdict.outcome == REJECTED:
            if verdict.fault:
                reason = f"{self.cfg.safety.reject_run} rejected actions in a row: "
                self.fault("safety", reason + verdict.reason)
            # the rejection's target is already this tick's hold (a controlled stop)
            return self._held(self.step, verdict.target)
        self.watchdog.played()
        return verdict.target

    def _held(self, step: int | None, target: np.ndarray | None = None) -> np.ndarray | None:
        if target is None:
            target = self.shield.hold() if self.latch.anchored else None
        if step is not None:
            self.counters.holds += 1
            if self.watchdog.held():
                self.counters.starved_episodes += 1
                self._end_after_tick = "starved"
            c = self.counters
            c.max_consecutive_holds = max(c.max_consecutive_holds, self.watchdog.max_consecutive)
        return target if self.latch.torque_on else None

    def _driver_trouble(self) -> np.ndarray | None:
        self.counters.driver_errors += 1
        self._driver_fail_run += 1
        if self._driver_fail_run >= self.cfg.safety.driver_fault_run:
            self.fault("driver", f"{self._driver_fail_run} failed joint reads in a row")
        # Without a fresh read the last approved target is still the safest command.
        anchored = self.latch.anchored and self.latch.torque_on
        return self.shield.hold() if anchored else None

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
