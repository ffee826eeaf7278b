"""The action queue: merges policy chunks by step and hands out one row per control tick.

Steps are the episode's control ticks. Row ``i`` of a chunk computed from step ``s`` is meant
for step ``s + i``; the queue keeps, for every row it holds, the step that row is meant for
(the rows it holds are always consecutive in step, so a front step and an index say it all).

Two timings (control.timing):

- ``sync``: the world waited for the chunk, so nothing is dropped; the queue becomes the first
  ``open_loop_horizon`` rows and :meth:`ActionQueue.pop` plays them **in order, one per call,
  whatever step it is given** (the step is only checked to move forwards).
- ``realtime``: the robot kept moving while the policy computed. With ``aligned`` (the default)
  a chunk from step ``s`` merged before step ``t``'s action is chosen loses its first
  ``t - s`` rows; a chunk with nothing left is stale (discarded, counted, queue unchanged).
  :meth:`ActionQueue.pop` hands out only the row meant for the step asked: rows meant for
  earlier steps are discarded and counted as ``rows_dropped`` — never played late.
  With ``aligned=False`` (the naive baseline) the whole chunk replaces the queue and, as in
  sync, rows play in order one per call whatever their step.

Merge modes (realtime aligned only; sync and naive always replace):

- ``replace``: the chunk's aligned rows replace the queue.
- ``fade``: as replace, then the offset ``o = last_played - new[0]`` (gripper dims: 0) is
  blended out linearly: ``played[j] = new[j] + o * (1 - (j + 1) / F)`` for ``j < F - 1``,
  ``F = fade_steps``; rows ``j >= F - 1`` play unchanged. So the first row of a new chunk
  lands exactly ``|o| / F`` from the last played row in every non-gripper dim, and grippers
  jump straight to the new chunk's value. No fade before anything was played.
- ``ensemble`` (ACT temporal ensembling): each future step plays the weighted mean over every
  chunk merged while that step was still ahead and that covers it,
  ``sum_i w_i * a_i / sum_i w_i`` with ``w_i = exp(-ensemble_decay * i)``, ``i = 0`` the
  oldest such chunk. Gripper dims are never averaged: the newest covering chunk's value plays.

Frozen rows (real-time chunking): ``merge(..., keep_before=f)`` leaves the queued rows meant
for steps before ``f`` exactly as they are (they were promised to a policy as its frozen
prefix); the chunk's own rows for those steps are dropped, and in every mode the chunk takes
effect from ``max(now_step, f)`` on (fade blends from the last kept row); a chunk with no
row beyond them is stale, and the queue keeps what it had. With
``fade_seam=True`` a replace merge fades as ``fade`` does, from the last row played or the
last frozen row kept: the lane asks it for a real-time chunking answer that came after its
frozen prefix had played, whose policy continued a seam the robot has already passed.

Hot path: :meth:`pop` does no array allocation (it copies one row into a preallocated buffer);
all allocation happens in :meth:`merge`, once per chunk.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from robotd.control.counters import QueueCounters
from robotd.control.queue_config import MergeMode, QueueConfig, Timing, _is_int

__all__ = ["ActionQueue", "MergeMode", "MergeResult", "QueueConfig", "Timing"]


@dataclass(slots=True)
class MergeResult:
    """What one merge did.

    ``dropped``: rows dropped because their step had passed (all ``H`` rows when wholly past);
    ``stale``: the chunk had no row to merge and was discarded, the queue unchanged: it was
    wholly in the past, or its rows not past were all for frozen steps (a horizon shorter
    than the frozen prefix);
    ``played_from``: index of the first chunk row kept (``H`` when stale).
    """

    dropped: int
    stale: bool
    played_from: int


class ActionQueue:
    """Chunks in, one action row per tick out. See the module docstring for the exact rules.

    Steps handed to :meth:`merge` (``now_step``) and :meth:`pop` must never go backwards, and a
    chunk must be merged before the action of its ``now_step`` is played (``now_step`` greater
    than the last played step); :meth:`flush` starts the step count afresh (episode reset).
    """

    def __init__(self, cfg: QueueConfig) -> None:
        self.cfg = cfg
        self.counters = QueueCounters()
        self._aligned_rt = cfg.timing == "realtime" and cfg.aligned
        self._grip = np.asarray(cfg.grippers, dtype=np.intp)
        self._blend = np.ones(cfg.dim, dtype=bool)  # dims that fade may touch
        self._blend[self._grip] = False
        self._fade_w = (1.0 - np.arange(1, cfg.fade_steps) / cfg.fade_steps)[:, None]
        self._rows = np.empty((0, cfg.dim))
        self._head = 0  # index in _rows of the next row to play
        self._front = 0  # step the row at _head is meant for
        # ensemble: per queued row, the weighted sum, the weight sum and the number of chunks
        self._wsum = np.empty((0, cfg.dim))
        self._wtot = np.empty(0)
        self._count = np.empty(0, dtype=np.int64)
        self._last = np.zeros(cfg.dim)
        self._last_ro = self._last.view()
        self._last_ro.flags.writeable = False
        self._has_last = False
        self._clock: int | None = None  # the latest step seen by merge or pop
        self._played_step: int | None = None

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        """Rows held (in realtime aligned mode possibly including rows whose step has passed,
        until the next merge or pop discards them)."""
        return self._rows.shape[0] - self._head

    @property
    def last_played(self) -> np.ndarray | None:
        """The last row handed out by pop (read-only, overwritten by the next pop); None
        before the first pop and after a flush that forgets the seam."""
        return self._last_ro if self._has_last else None

    @property
    def front_step(self) -> int | None:
        """The step the next queued row is meant for, or None when the queue is empty."""
        return self._front if len(self) else None

    def peek(self) -> np.ndarray:
        """The queued rows, next first (a read-only view; valid until the next merge)."""
        view = self._rows[self._head :]
        view.flags.writeable = False
        return view

    def ahead(self, step: int) -> np.ndarray:
        """The queued rows that will play from ``step`` on, next first (read-only view, valid
        until the next merge): realtime aligned skips rows meant for earlier steps; sync and
        naive realtime play in order, so it is every queued row."""
        view = self._rows[self._head + self._passed(step) :]
        view.flags.writeable = False
        return view

    def left(self, step: int) -> int:
        """How many queued rows will play from ``step`` on (as :meth:`ahead`, counted)."""
        return len(self) - self._passed(step)

    def _passed(self, step: int) -> int:
        """Queued rows meant for steps before ``step`` (realtime aligned; else 0): rows for
        skipped steps that the next pop discards."""
        return max(0, min(step - self._front, len(self))) if self._aligned_rt else 0

    def should_ask(self, in_flight: bool, refill: int | None = None, step: int = 0) -> bool:
        """Whether to ask the policy for a chunk now, before the action of ``step`` (0, or
        any step not past the front: every queued row counts).

        sync: the queue is empty and no act is in flight; realtime: at most ``refill`` rows
        remain for ``step`` on (default ``refill_steps``, which "auto" leaves to the caller)
        and no act is in flight.
        """
        if in_flight:
            return False
        if self.cfg.timing == "sync":
            return len(self) == 0
        if refill is None:
            if self.cfg.refill_steps == "auto":
                raise ValueError("ActionQueue.should_ask: refill_steps 'auto' needs refill")
            refill = self.cfg.refill_steps
        return self.left(step) <= refill

    # ------------------------------------------------------------------ merging
    def merge(
        self,
        chunk: np.ndarray,
        from_step: int,
        now_step: int,
        keep_before: int | None = None,
        *,
        fade_seam: bool = False,
    ) -> MergeResult:
        """Merge ``chunk`` (H x dim) computed from ``from_step``, arriving before the action of
        ``now_step`` is chosen; realtime aligned keeps the queued rows for steps before
        ``keep_before`` (frozen); ``fade_seam``: fade from the last row played (or the last
        frozen row kept) whatever the merge mode but ensemble. Raises ValueError on a bad chunk or
        bad steps (queue unchanged)."""
        rows = self._validate_chunk(chunk)
        from_step, now_step = self._check_merge_steps(from_step, now_step)
        self.counters.chunks += 1
        height = rows.shape[0]
        if self.cfg.timing == "sync":
            self._replace(rows[: self.cfg.open_loop_horizon], from_step)
            return MergeResult(dropped=0, stale=False, played_from=0)
        if not self.cfg.aligned:
            self._replace(rows, from_step)
            return MergeResult(dropped=0, stale=False, played_from=0)
        drop = now_step - from_step
        if drop >= height:
            self.counters.stale_chunks += 1
            self.counters.merge_dropped += height
            return MergeResult(dropped=height, stale=True, played_from=height)
        self.counters.merge_dropped += drop
        self._discard_before(now_step)
        # rows kept as they are (frozen), then the chunk from the step after them
        keep = min(max(0, (keep_before or 0) - now_step), len(self))
        cut = drop + keep
        if cut >= height:  # rows only for frozen steps: nothing to merge, the queue stays
            self.counters.stale_chunks += 1
            return MergeResult(dropped=drop, stale=True, played_from=height)
        fresh = rows[cut:]
        fade = self.cfg.merge == "fade" or fade_seam
        if self.cfg.merge == "ensemble":
            self._ensemble(fresh, now_step, keep)
        elif keep:
            kept = self._rows[self._head : self._head + keep]
            if fade:
                self._fade(fresh, kept[-1])
            self.counters.replaced_rows += len(self) - keep
            self._install(np.concatenate([kept, fresh]), now_step)
        else:
            if fade and self._has_last:
                self._fade(fresh, self._last)
            self._replace(fresh, now_step)
        return MergeResult(dropped=drop, stale=False, played_from=min(cut, height))

    def _replace(self, rows: np.ndarray, front_step: int) -> None:
        self.counters.replaced_rows += len(self)
        self._install(rows, front_step)

    def _install(self, rows: np.ndarray, front_step: int) -> None:
        self._rows = rows
        self._head = 0
        self._front = front_step

    def _fade(self, fresh: np.ndarray, seam: np.ndarray) -> None:
        """Blend ``seam - fresh[0]`` out over the first ``fade_steps - 1`` rows, in place
        (``seam``: the last row played, or the last frozen row kept before ``fresh``)."""
        offset = np.where(self._blend, seam - fresh[0], 0.0)
        n = min(fresh.shape[0], self._fade_w.shape[0])
        fresh[:n] += self._fade_w[:n] * offset

    def _ensemble(self, fresh: np.ndarray, now_step: int, keep: int = 0) -> None:
        """Fold ``fresh`` (rows for steps now_step + keep, ...) into the running means; the
        first ``keep`` queued rows (frozen) stay exactly as they are.

        After _discard_before(now_step) the queue, if not empty, starts exactly at now_step
        (steps only move forwards), so old and new rows line up index by index.
        """
        head, old, new = self._head, len(self), fresh.shape[0]
        size = max(old, keep + new)
        wsum = np.zeros((size, self.cfg.dim))
        wtot = np.zeros(size)
        count = np.zeros(size, dtype=np.int64)
        wsum[:old] = self._wsum[head:]
        wtot[:old] = self._wtot[head:]
        count[:old] = self._count[head:]
        span = slice(keep, keep + new)
        weight = np.exp(-self.cfg.ensemble_decay * count[span])
        wsum[span] += weight[:, None] * fresh
        wtot[span] += weight
        count[span] += 1
        rows = wsum / wtot[:, None]
        if self._grip.size:
            rows[:old, self._grip] = self._rows[head : head + old, self._grip]
            rows[span, self._grip] = fresh[:, self._grip]
        rows[:keep] = self._rows[head : head + keep]  # bit for bit
        self._wsum, self._wtot, self._count = wsum, wtot, count
        self._install(rows, now_step)

    # ------------------------------------------------------------------ playing
    def pop(self, step: int) -> np.ndarray | None:
        """The row for ``step``, or None when there is none (the caller then holds).

        realtime aligned: rows meant for steps before ``step`` are discarded first and counted
        as ``rows_dropped``; only the row meant for ``step`` itself is returned.
        sync and naive realtime: the next row in order, whatever step it was meant for.
        The returned array is read-only and overwritten by the next pop (copy it to keep it).
        """
        step = self._advance_clock(step)
        if self._aligned_rt:
            self._discard_before(step)
            if len(self) == 0 or self._front != step:
                return None
        elif len(self) == 0:
            return None
        self._last[...] = self._rows[self._head]  # (cheaper than np.copyto's dispatch)
        self._head += 1
        self._front += 1
        self._has_last = True
        self._played_step = step
        return self._last_ro

    def commanded(self, target: np.ndarray) -> None:
        """What the robot was really commanded this tick (after the shield: a clamp, a
        rejection, a hold): the seam a fade starts from. Absolute targets only; without it
        the seam is the last row popped."""
        self._last[...] = target
        self._has_last = True

    def flush(self, *, keep_seam: bool = False) -> int:
        """Empty the queue (episode reset, fault); returns the rows discarded.

        Step checks start afresh (the next episode counts from 0 again). ``keep_seam=True``
        keeps ``last_played`` so that a fade can start from it (e.g. a worker-side reset while
        the robot stays where it is); by default it is forgotten.
        """
        n = len(self)
        self.counters.flushed_rows += n
        self._install(np.empty((0, self.cfg.dim)), 0)
        self._wsum = np.empty((0, self.cfg.dim))
        self._wtot = np.empty(0)
        self._count = np.empty(0, dtype=np.int64)
        self._clock = None
        self._played_step = None
        if not keep_seam:
            self._has_last = False
        return n

    # ------------------------------------------------------------------ helpers
    def _discard_before(self, step: int) -> None:
        late = min(step - self._front, len(self))
        if late > 0:
            self._head += late
            self._front += late
            self.counters.rows_dropped += late

    def _validate_chunk(self, chunk: np.ndarray) -> np.ndarray:
        try:
            rows = np.array(chunk, dtype=np.float64)  # a private copy: fade edits it in place
        except (TypeError, ValueError) as exc:
            raise ValueError(f"ActionQueue.merge: chunk is not numeric rows: {exc}") from exc
        if rows.ndim != 2 or rows.shape[0] < 1 or rows.shape[1] != self.cfg.dim:
            raise ValueError(
                f"ActionQueue.merge: chunk shape {rows.shape}, expected (H >= 1, {self.cfg.dim})"
            )
        finite = np.isfinite(rows)
        if np.count_nonzero(finite) != rows.size:  # (half the cost of finite.all())
            bad_row, bad_dim = np.argwhere(~finite)[0]
            raise ValueError(
                f"ActionQueue.merge: chunk holds a non-finite value at row {bad_row}, "
                f"dim {bad_dim}: {rows[bad_row, bad_dim]}"
            )
        return rows

    def _check_merge_steps(self, from_step: int, now_step: int) -> tuple[int, int]:
        from_step = _step("merge", "from_step", from_step)
        now_step = _step("merge", "now_step", now_step)
        if from_step > now_step:
            raise ValueError(
                f"ActionQueue.merge: from_step {from_step} is after now_step {now_step}"
            )
        if self._played_step is not None and now_step <= self._played_step:
            raise ValueError(
                f"ActionQueue.merge: now_step {now_step} but step {self._played_step} was "
                "already played; a chunk arriving after that action needs now_step "
                f"{self._played_step + 1}"
            )
        if self._clock is not None and now_step < self._clock:
            raise ValueError(
                f"ActionQueue.merge: now_step {now_step} went backwards (already at {self._clock})"
            )
        self._clock = now_step
        return from_step, now_step

    def _advance_clock(self, step: int) -> int:
        # pop's caller is the kernel, which counts steps itself: only their order is checked
        # here, every tick, not their type.
        if self._clock is not None and step < self._clock:
            raise ValueError(
                f"ActionQueue.pop: step {step} went backwards (already at {self._clock})"
            )
        if self._played_step is not None and step <= self._played_step:
            raise ValueError(f"ActionQueue.pop: step {step} was already played")
        self._clock = step
        return step


def _step(where: str, name: str, value: object) -> int:
    if type(value) is int:  # the kernel's own counts: the common case, checked cheapest
        return value
    if not _is_int(value):
        raise TypeError(f"ActionQueue.{where}: {name} must be an integer step, got {value!r}")
    return operator.index(value)  # type: ignore[arg-type]
