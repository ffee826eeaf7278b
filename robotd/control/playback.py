"""The action side of an episode in the control lane: asks, answers, the queue.

At most one act is in flight. Its answer (a Chunk) is merged into the ActionQueue at
the start of the next tick, aligned by step; answers to any other ask (an episode
that changed meanwhile, a late reply) are discarded and counted. Rows come out one
per tick with `pop`. A failed act waits half a second before the next ask, so a
dead worker is not hammered every tick.

Real-time chunking: every realtime aligned ask carries the predicted delay d
(robotd.control.delay) and the frozen prefix, the queued rows for steps s … s+d−1 (and
the rest of the queue apart). With a contract that says the policy takes them, those
rows are promised: no merge changes a row for a step before the furthest prefix handed
out. An answer merged at t > s + d was later than predicted: counted in
`delay_overruns`. An rtc answer merged once every row of its act's frozen prefix has
played (late, or asked with fewer rows queued than its delay) continued a seam the robot
has passed: it played other rows, or held, meanwhile. So that answer is faded in from
the last row played, as merge = "fade" does, over fade_steps (control_mode "absolute"
only: delta and velocity rows are not positions, and blending one toward the last played
would add motion). With `refill_steps = "auto"` the next act is asked when the rows left
fall to the predicted delay plus a margin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from robotd.config import Config
from robotd.control.counters import AskLatency, Counters
from robotd.control.delay import DelayPredictor
from robotd.control.queue import ActionQueue, QueueConfig
from robotd.lane.messages import Ask, Event, Merged, Rows, Rtc

Emit = Callable[[Any], None]
RETRY_AFTER_S = 0.5


@dataclass(slots=True)
class Chunk:
    """Rows computed from step `step` of worker episode `wep`, answering ask `ask_id`."""

    ask_id: int
    wep: str
    step: int
    rows: np.ndarray


class Playback:
    """Owns the ActionQueue and the act in flight; the kernel calls it once a tick."""

    def __init__(
        self,
        qcfg: QueueConfig,
        *,
        dt: float,
        counters: Counters,
        emit: Emit,
        delay: DelayPredictor | None = None,
        absolute: bool = True,
    ) -> None:
        self._qcfg = qcfg
        self.queue = ActionQueue(qcfg)
        self.dt = dt
        self.counters = counters
        self.emit = emit
        self.ask_latency = AskLatency()
        self.delay = delay or DelayPredictor()
        self.rtc = False  # the policy takes the frozen prefix: the merge keeps it
        self._absolute = absolute  # rows are joint positions (a seam between them can fade)
        self._rtc_acts = qcfg.timing == "realtime" and qcfg.aligned
        self.in_flight: int | None = None  # ask id
        self._ask_id = 0
        self._ask_ns = 0
        self._ask_delay = 0  # the delay the act in flight predicted (0: none)
        self._frozen_until = 0  # no merge changes a queued row for a step before this
        self._prefix_end = 0  # the step after the frozen prefix of the act in flight (0: none)
        self._retry_at_tick = 0
        self._pending: list[Chunk] = []

    def configure(self, open_loop_horizon: int | None, rtc: bool = False) -> None:
        """The worker's action contract: sync plays at most this many rows of a chunk;
        `rtc`: the policy takes the frozen prefix (the merge keeps it). An act in flight is
        abandoned (its answer, when it comes, is discarded and the lane asks anew): it was
        asked under the old contract, and the rows its prefix froze are flushed here, so no
        promise made to it holds any more."""
        if self.in_flight is not None:
            self._event("act_abandoned", ask=self.in_flight, reason="the contract changed")
            self.in_flight = None
        self._pending.clear()
        self.queue.flush()
        self._frozen_until = self._prefix_end = 0
        self.rtc = rtc
        self._qcfg = replace(self._qcfg, open_loop_horizon=open_loop_horizon)
        self.queue = ActionQueue(self._qcfg)

    def reset(self, *, keep_seam: bool = False) -> int:
        """A new (worker-side) episode: nothing queued, nothing in flight, no back-off owed
        to the old episode's failed act (the new one asks at once). Returns rows flushed."""
        self.in_flight = None
        self._retry_at_tick = 0
        self._pending.clear()
        self._frozen_until = self._prefix_end = 0
        return self.queue.flush(keep_seam=keep_seam)

    def refill(self) -> int:
        """Realtime: the next act is asked when at most this many rows remain."""
        fixed = self._qcfg.refill_steps
        return self.delay.refill() if fixed == "auto" else fixed

    def deliver(self, chunk: Chunk) -> None:
        """A chunk arrived; it is merged at the start of the next tick."""
        self._pending.append(chunk)

    def failed(self, ask_id: int, tick: int) -> bool:
        """The act `ask_id` failed; True when it was the one in flight (then back off)."""
        if ask_id != self.in_flight:
            return False
        self.in_flight = None
        self.counters.act_failures += 1
        self._retry_at_tick = tick + max(1, int(RETRY_AFTER_S / self.dt))
        return True

    def should_ask(self, tick: int, step: int) -> bool:
        """Whether to ask before the action of `step` (tick: the lane's tick count)."""
        if tick < self._retry_at_tick:
            return False
        return self.queue.should_ask(self.in_flight is not None, self.refill(), step)

    def ask(self, *, wep: str, step: int, episode: int, now_ns: int) -> Ask:
        """Put an act in flight; returns the ask message (the caller emits it)."""
        self._ask_id += 1
        self.in_flight = self._ask_id
        self._ask_ns = now_ns
        self.counters.acts += 1
        self._prefix_end = 0
        rtc = self._rtc(step) if self._rtc_acts else None
        return Ask(self._ask_id, wep, step, episode, self.queue.left(step), rtc)

    def _rtc(self, step: int) -> Rtc:
        """The act's predicted delay and its frozen prefix (promised, with an rtc contract):
        at least the rows an earlier act's prefix still freezes, so the prefix is every row
        that will play whatever this act answers."""
        d = self.delay.predict()
        ahead = self.queue.ahead(step)
        if self.rtc:  # rows still frozen for an earlier act play whatever this one answers
            d = max(d, min(self._frozen_until - step, ahead.shape[0]))
        self._ask_delay = d
        n = min(d, ahead.shape[0])
        if self.rtc and n:
            self._prefix_end = step + n
            self._frozen_until = max(self._frozen_until, step + n)
        prefix = Rows.of(ahead[:n]) if n else None
        rest = Rows.of(ahead[n:]) if ahead.shape[0] > n else None
        return Rtc(d, prefix, rest)

    def merge_pending(self, *, wep: str, step: int, now_ns: int) -> None:
        """Merge the answer to the act in flight, if it came; discard any other."""
        for chunk in self._pending:
            if chunk.ask_id != self.in_flight or chunk.wep != wep:
                self.counters.late_chunks += 1
                self._event("chunk_discarded", ask=chunk.ask_id, reason="not the act in flight")
                continue
            self.in_flight = None
            self._merge(chunk, step, now_ns)
        self._pending.clear()

    def _merge(self, chunk: Chunk, step: int, now_ns: int) -> None:
        rows = chunk.rows
        dim = self._qcfg.dim
        if rows.ndim != 2 or rows.shape[1] != dim or rows.shape[0] == 0:
            self._bad(chunk, f"rows of shape {list(rows.shape)}; this robot needs (H >= 1, {dim})")
            return
        keep = self._frozen_until if self.rtc else None
        # the act's frozen prefix has all played (a delta or a velocity is not faded)
        past = self._absolute and 0 < self._prefix_end < step
        try:
            result = self.queue.merge(rows, chunk.step, step, keep_before=keep, fade_seam=past)
        except ValueError as exc:  # NaN/inf or non-numeric rows: refused whole, hold
            self._bad(chunk, str(exc)[:200])
            return
        self.counters.chunks += 1
        took = step - chunk.step
        if self._ask_delay and took > self._ask_delay:
            self.counters.delay_overruns += 1
        self.ask_latency.add(took, now_ns - self._ask_ns)
        self.delay.add(took)
        self.emit(
            Merged(
                chunk.ask_id,
                chunk.wep,
                chunk.step,
                step,
                int(rows.shape[0]),
                result.dropped,
                result.stale,
                self.refill() if self._qcfg.timing == "realtime" else 0,
            )
        )

    def _bad(self, chunk: Chunk, why: str) -> None:
        """A chunk refused whole: counted, reported, and the next ask backs off like a failed
        act, so a policy that always answers wrong is not asked (and logged) every tick."""
        self.counters.bad_chunks += 1
        self._retry_at_tick = self.counters.ticks + max(1, int(RETRY_AFTER_S / self.dt))
        self._event("bad_chunk", ask=chunk.ask_id, error=why)

    def pop(self, step: int) -> np.ndarray | None:
        """The row for this step, or None (hold). In realtime, a row the queue's own
        bookkeeping says was meant for an earlier step (the naive baseline) is counted in
        stale_rows_played."""
        queue = self.queue
        front, dropped = queue.front_step, queue.counters.rows_dropped
        row = queue.pop(step)
        if row is not None and front is not None and self._qcfg.timing == "realtime":
            meant = front + queue.counters.rows_dropped - dropped  # rows skipped by pop
            if meant < step:
                self.counters.stale_rows_played += 1
        return row

    def _event(self, name: str, **detail: Any) -> None:
        self.emit(Event(name, self.counters.ticks, detail))


def playback_for(cfg: Config, *, dt: float, counters: Counters, emit: Emit) -> Playback:
    """The playback a robot's config asks for (its control section and its joints)."""
    c = cfg.control
    qcfg = QueueConfig(
        dim=len(cfg.joints.names),
        timing=c.timing,
        open_loop_horizon=None,
        refill_steps=c.refill_steps,
        merge=c.merge,
        fade_steps=c.fade_steps,
        ensemble_decay=c.ensemble_decay,
        grippers=cfg.joints.gripper_indices(),
        aligned=c.aligned,
    )
    return Playback(
        qcfg,
        dt=dt,
        counters=counters,
        emit=emit,
        delay=DelayPredictor(c.delay_quantile, c.delay_margin_steps),
        absolute=c.control_mode == "absolute",  # rows are positions
    )
