"""The action side of an episode in the control lane: asks, answers, the queue.

At most one act is in flight. Its answer (a Chunk) is merged into the ActionQueue at
the start of the next tick, aligned by step; answers to any other ask (an episode
that changed meanwhile, a late reply) are discarded and counted. Rows come out one
per tick with `pop`. A failed act waits half a second before the next ask, so a
dead worker is not hammered every tick.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from robotd.control.counters import AskLatency, Counters
from robotd.control.queue import ActionQueue, QueueConfig
from robotd.lane.messages import Ask, Event, Merged

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

    def __init__(self, qcfg: QueueConfig, *, dt: float, counters: Counters, emit: Emit) -> None:
        self._qcfg = qcfg
        self.queue = ActionQueue(qcfg)
        self.dt = dt
        self.counters = counters
        self.emit = emit
        self.ask_latency = AskLatency()
        self.in_flight: int | None = None  # ask id
        self._ask_id = 0
        self._ask_ns = 0
        self._retry_at_tick = 0
        self._pending: list[Chunk] = []

    def configure(self, open_loop_horizon: int | None) -> None:
        """The worker's action contract: sync plays at most this many rows of a chunk."""
        self.queue.flush()
        self._qcfg = replace(self._qcfg, open_loop_horizon=open_loop_horizon)
        self.queue = ActionQueue(self._qcfg)

    def reset(self, *, keep_seam: bool = False) -> int:
        """A new (worker-side) episode: nothing queued, nothing in flight. Returns rows flushed."""
        self.in_flight = None
        self._pending.clear()
        return self.queue.flush(keep_seam=keep_seam)

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

    def should_ask(self, tick: int) -> bool:
        return tick >= self._retry_at_tick and self.queue.should_ask(self.in_flight is not None)

    def ask(self, *, wep: str, step: int, episode: int, now_ns: int) -> Ask:
        """Put an act in flight; returns the ask message (the caller emits it)."""
        self._ask_id += 1
        self.in_flight = self._ask_id
        self._ask_ns = now_ns
        self.counters.acts += 1
        return Ask(self._ask_id, wep, step, episode, len(self.queue))

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
        try:
            result = self.queue.merge(rows, chunk.step, step)
        except ValueError as exc:  # NaN/inf or non-numeric rows: refused whole, hold
            self._bad(chunk, str(exc)[:200])
            return
        self.counters.chunks += 1
        self.ask_latency.add(step - chunk.step, now_ns - self._ask_ns)
        self.emit(
            Merged(
                chunk.ask_id,
                chunk.wep,
                chunk.step,
                step,
                int(rows.shape[0]),
                result.dropped,
                result.stale,
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
