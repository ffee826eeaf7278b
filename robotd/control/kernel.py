"""The control kernel: one tick's update between reading and writing the joints.

read (robotd.control.tick) → record step s → merge any chunk that arrived → ask if the
queue runs low → pop the next row or hold → shield → target to write (robotd.control.tick).

It owns the episode state (EpisodeMachine and FaultLatch), the action queue (Playback)
and the shield, and knows nothing of clocks, sockets or processes: the control process
drives it from its ticker and ZeroMQ sockets, the virtual-clock runner step by step.
Everything it tells the outside world goes through `emit(message)` as a typed lane
message (robotd.lane.messages). The state, and what commands and messages do to it between
ticks, is robotd.control.lifecycle's (Kernel's base class); this module is the tick alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from drivers.base import JointState
from robotd.control.episode import State
from robotd.control.lifecycle import Lifecycle
from robotd.control.shield import REJECTED
from robotd.lane.messages import FrameRef


class Kernel(Lifecycle):
    """Per-tick control logic; see the module docstring for the order of work, and
    Lifecycle for the state and the commands (`command`, `deliver`, `fault`, ...)."""

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
