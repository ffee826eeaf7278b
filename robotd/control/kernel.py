"""The control kernel: one tick's update between reading and writing the joints.

read (the caller) → build step s → merge any chunk that arrived → ask if the queue
runs low → pop the next action or hold → shield → target to write (the caller).

It owns the episode state, the action queue and the shield, and knows nothing of
clocks, sockets or processes: the control process drives it from its ticker and
ZeroMQ sockets, the virtual-clock runner drives it step by step. Everything it
tells the outside world goes through `emit(message)` as a small dict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from drivers.base import JointState
from robotd.config import Config
from robotd.control.counters import Counters
from robotd.control.episode import CommandRefused, EpisodeMachine, State
from robotd.control.playback import Chunk, Playback
from robotd.control.queue import QueueConfig
from robotd.control.shield import REJECTED, Shield
from robotd.control.watchdog import Watchdog

Emit = Callable[[dict[str, Any]], None]


class Kernel:
    """Per-tick control logic; see the module docstring for the order of work."""

    def __init__(
        self,
        cfg: Config,
        *,
        run_id: str,
        emit: Emit,
        asker: Callable[[dict[str, Any]], Chunk | None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.emit = emit
        # The wall-clock lane only sends the ask; the virtual runner answers it at once.
        self._asker = asker
        self.names = list(cfg.joints.names)
        self.dim = len(self.names)
        self.dt = 1.0 / cfg.control.hz
        c = cfg.control
        self.machine = EpisodeMachine(cfg.robot.start)
        qcfg = QueueConfig(
            dim=self.dim,
            timing=c.timing,
            open_loop_horizon=None,
            refill_steps=c.refill_steps,
            merge=c.merge,
            fade_steps=c.fade_steps,
            ensemble_decay=c.ensemble_decay,
            grippers=cfg.joints.gripper_indices(),
            aligned=c.aligned,
        )
        s = cfg.safety
        self.shield = Shield(
            self.names,
            np.asarray(cfg.joints.lower),
            np.asarray(cfg.joints.upper),
            clip_tolerance=s.clip_tolerance,
            dt=self.dt,
            max_velocity=None if s.max_velocity is None else np.asarray(s.max_velocity),
            max_acceleration=None if s.max_acceleration is None else np.asarray(s.max_acceleration),
            reject_run=s.reject_run,
        )
        self.counters = Counters()
        self.playback = Playback(qcfg, dt=self.dt, counters=self.counters, emit=emit)
        self._now_ns = 0  # the present tick's time
        self.cam_limits = {name: int(cam.max_age_ms * 1e6) for name, cam in cfg.cameras.items()}
        self.step = 0  # step within the worker-side episode
        self.wep = ""  # worker-side episode id
        self._wep_n = 0
        self.watchdog = Watchdog(cfg.control.max_hold_steps)
        self._grippers = list(cfg.joints.gripper_indices())
        self._absolute = cfg.control.control_mode == "absolute"
        self._end_after_tick = ""  # an outcome decided mid-tick, applied once the step is counted
        self._last_record: dict[str, Any] | None = None  # what a skipped step reads
        self._skip = 0  # steps to skip before this tick's own (overruns, failed reads)
        self._driver_fail_run = 0
        self.torque_on = True
        self._torque_off_at_tick: int | None = None
        self._anchored = False
        # A simulated robot starts its first episode by itself, once the policy link is up.
        self._autostart = cfg.robot.start == "episode"

    # ---- commands and messages from the main process --------------------------------------

    def command(self, cmd: str, args: dict[str, Any]) -> dict[str, Any]:
        """Apply an operator command; returns the result or raises CommandRefused."""
        m = self.machine
        if cmd == "estop":
            self._latch("estop", str(args.get("reason") or "operator e-stop"), active=False)
        elif cmd == "clear_fault":
            m.clear_fault()
            self.torque_on = True
            self._torque_off_at_tick = None
            # The joints may have moved (sagged, pushed) while torque was off: hold where they
            # are now, never jump back to the old target.
            self._anchored = False
            self._event("fault_cleared")
        elif cmd == "start":
            m.start()
            self._start_episode(already_started=True)
        elif cmd == "stop":
            if not self._end_episode("stopped"):
                raise CommandRefused("bad_state", f"stop needs RUNNING, state is {m.state}")
        elif cmd == "reset_done":
            m.reset_done()
            self._event("reset_done")
        elif cmd == "status":
            pass
        else:
            raise CommandRefused("unknown_command", f"the control lane has no command {cmd!r}")
        return self.status()

    def status(self) -> dict[str, Any]:
        m = self.machine
        return {
            "state": str(m.state),
            "episode": m.episode,
            "wep": self.wep,
            "step": self.step,
            "outcome": m.outcome,
            "fault": None
            if m.fault is None
            else {"cause": m.fault.cause, "detail": m.fault.detail, "active": m.fault.active},
            "queue": len(self.playback.queue),
            "in_flight": self.playback.in_flight is not None,
            "torque": self.torque_on,
        }

    def stats(self) -> dict[str, Any]:
        """Every counter of the run so far (cumulative), as the summary and telemetry name them."""
        q = self.playback.queue.counters
        s = self.shield.counters
        return {
            **asdict(self.counters),
            "stale_chunks": q.stale_chunks,
            # every row given up because its step had passed: at merge (the latency drop,
            # stale chunks whole) and at pop
            "rows_dropped": q.rows_dropped + q.merge_dropped,
            "merge_dropped": q.merge_dropped,
            "ask_latency": self.playback.ask_latency.to_wire(),
            "interventions": s.interventions,
            "clipped": s.clipped,
            "clamped": s.clamped,
            "rejected": s.rejected,
        }

    def set_contract(self, open_loop_horizon: int | None) -> None:
        """The worker's action contract: sync plays at most this many rows of a chunk."""
        self.playback.configure(open_loop_horizon)
        if self._autostart:
            self._autostart = False
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
        keep = queue.peek().copy() if self.cfg.control.finish_queue_on_reset else None
        old = self.wep
        flushed = self._new_worker_episode(keep_seam=True)
        if keep is not None and len(keep):
            # Let the queued rows finish: they become rows of the new episode from its step 0.
            self.playback.queue.merge(keep, 0, 0)
            flushed = 0
        self._event("episode_reset", cause=cause, old_wep=old, new_wep=self.wep, flushed=flushed)

    # ---- the tick --------------------------------------------------------------------------

    def update(
        self,
        now_ns: int,
        joints: JointState | None,
        frames: dict[str, tuple[int, int] | None],
        truth: dict[str, float] | None = None,
        skipped: int = 0,
    ) -> np.ndarray | None:
        """One tick. `joints` None means the read failed this tick; `skipped` counts the
        deadlines the ticker skipped just before it (an overrun). Returns the target to
        write, or None when nothing may be written (torque off or no joint state yet)."""
        self.counters.ticks += 1
        self._now_ns = now_ns
        self._skip += skipped
        if joints is None:
            self._skip += 1  # a tick without a read is a step nothing was read at
            return self._driver_trouble()
        self._driver_fail_run = 0
        if not self._anchored:
            self.shield.reset(joints.position)
            self._anchored = True
        self.machine.cause_gone("driver")
        if self.machine.state is State.ENDED:
            self.machine.begin_reset()
        self._check_torque()
        if self.machine.state is not State.RUNNING:
            self._skip = 0
            return self._held(None)
        if self._skip:
            n, self._skip = self._skip, 0
            if not self._skip_steps(n):
                return self._held(None)
        valid = self._record_step(now_ns, joints, frames, truth)
        pb = self.playback
        pb.merge_pending(wep=self.wep, step=self.step, now_ns=now_ns)
        if valid and pb.should_ask(self.counters.ticks):
            self._ask()
        row = pb.pop(self.step)
        target = self._play(row) if row is not None else self._held(self.step)
        if self._absolute and target is not None:
            pb.queue.commanded(target)
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

    def _skip_steps(self, skipped: int) -> bool:
        """Steps are ticks of the wall clock: an overrun's skipped deadlines are steps too, so
        rows keep their meant-for time (the queue drops the passed ones). Nothing was read at
        them; each reads what the drivers last held (the previous step's record, marked).
        False when the skipped steps reached max_steps and ended the episode."""
        last = self._last_record
        for _ in range(skipped):
            if last is not None:
                self.emit({**last, "s": self.step, "gt": None, "skipped": True})
            self.step += 1
            self.counters.steps += 1
            self.counters.skipped_steps += 1
            limit = self.cfg.control.max_steps
            if limit and self.step >= limit:
                self._end_episode("max_steps")
                return False
        return True

    def _record_step(self, now_ns, joints, frames, truth) -> bool:
        cams = {}
        valid = True
        for name, limit in self.cam_limits.items():
            latest = frames.get(name)
            cams[name] = latest
            if latest is None or now_ns - latest[1] > limit:
                valid = False
        if not valid:
            self.counters.invalid_observations += 1
        record = {
            "k": "step",
            "ep": self.machine.episode,
            "wep": self.wep,
            "s": self.step,
            "t": now_ns,
            "pos": joints.position.tolist(),
            "vel": joints.velocity.tolist(),
            "cams": cams,
            "ok": valid,
            "gt": truth or None,
        }
        self._last_record = record
        self.emit(record)
        return valid

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

    def _play(self, row: np.ndarray) -> np.ndarray:
        mode = self.cfg.control.control_mode
        if mode != "absolute":
            # Arm joints move by the row (delta, or velocity × dt); grippers are commanded
            # absolutely in every mode, as policies trained on delta actions expect.
            step = row if mode == "delta" else row * self.dt
            absolute = row
            row = self.shield.last + step
            row[self._grippers] = absolute[self._grippers]
        verdict = self.shield.check(row)
        if verdict.outcome != "ok":
            self.emit(
                {
                    "k": "shield",
                    "outcome": verdict.outcome,
                    "reason": verdict.reason,
                    "s": self.step,
                }
            )
        if verdict.outcome == REJECTED:
            if verdict.fault:
                self._latch(
                    "safety",
                    f"{self.cfg.safety.reject_run} rejected actions in a row: {verdict.reason}",
                )
            return self._held(self.step)
        self.watchdog.played()
        return verdict.target

    def _held(self, step: int | None) -> np.ndarray | None:
        target = self.shield.hold() if self._anchored else None
        if step is None:
            return target if self.torque_on else None
        self.counters.holds += 1
        if self.watchdog.held():
            self.counters.starved_episodes += 1
            self._end_after_tick = "starved"
        c = self.counters
        c.max_consecutive_holds = max(c.max_consecutive_holds, self.watchdog.max_consecutive)
        return target if self.torque_on else None

    def _driver_trouble(self) -> np.ndarray | None:
        self.counters.driver_errors += 1
        self._driver_fail_run += 1
        if self._driver_fail_run >= self.cfg.safety.driver_fault_run:
            self._latch("driver", f"{self._driver_fail_run} failed joint reads in a row")
        # Without a fresh read the last approved target is still the safest command.
        return self.shield.hold() if self._anchored and self.torque_on else None

    def _check_torque(self) -> None:
        if self._torque_off_at_tick is not None and self.counters.ticks >= self._torque_off_at_tick:
            self._torque_off_at_tick = None
            if self.torque_on:
                self.torque_on = False
                self._event("torque_off")

    # ---- episodes --------------------------------------------------------------------------

    def _start_episode(self, already_started: bool = False) -> None:
        if not already_started:
            self.machine.start()
        self.counters.episodes += 1
        self.watchdog.reset()
        self._new_worker_episode()
        self._event("episode_start", episode=self.machine.episode, wep=self.wep)

    def _new_worker_episode(self, *, keep_seam: bool = False) -> int:
        self._wep_n += 1
        self.wep = f"{self.run_id}-{self._wep_n}"
        self.step = 0
        self._last_record = None
        return self.playback.reset(keep_seam=keep_seam)

    def _end_episode(self, outcome: str) -> bool:
        if not self.machine.end(outcome):
            return False
        flushed = self.playback.reset()
        self._event(
            "episode_end",
            episode=self.machine.episode,
            wep=self.wep,
            outcome=outcome,
            steps=self.step,
            flushed=flushed,
        )
        return True

    def _latch(self, cause: str, detail: str, *, active: bool = True) -> None:
        was_running = self.machine.state is State.RUNNING
        if was_running:
            self._event(
                "episode_end",
                episode=self.machine.episode,
                wep=self.wep,
                outcome="fault",
                steps=self.step,
                flushed=self.playback.reset(),
            )
        entered = self.machine.latch(cause, detail, active=active)
        if entered:
            category = self.cfg.safety.estop_category
            if cause == "estop" and category == 0:
                self.torque_on = False
            elif cause == "estop":
                # Category 1: hold (controlled stop) for half a second, then torque off.
                self._torque_off_at_tick = self.counters.ticks + max(1, int(0.5 / self.dt))
            self._event("fault", cause=cause, detail=detail)

    def _event(self, name: str, **fields: Any) -> None:
        self.emit({"k": "event", "name": name, "tick": self.counters.ticks, **fields})
