"""What goes up to the worker, and when: the steps some act will read, ahead of the
acts, on the observe connection (robotd.link.observe).

`Uplink` is fed by the main process from the control lane's messages:
- every-stream keys go up as each step is made (the next act reads all of them);
- at-window keys of the *predicted* next ask: the prediction is formed when the previous
  act's chunk is merged (the control lane's "chunk" message), which makes it exact: sync
  asks again once the chunk's min(rows, open_loop_horizon) rows have played; realtime once
  at most the merge report's `refill` rows remain of the queue the merge left. Window steps
  already made then go up at once (read back from the robot-side rings), later ones as they
  are made. An episode's first act is predicted at its first step;
- `ensure`: just before an act, whatever its window reads that has not gone up (a
  misprediction), and everything of its window still queued, ahead of everything else and
  past the limits (the act waits for it); `inline`: what the worker still lacks after
  waiting, encoded for the act itself;
- `settled`: the act's outcome. An act that never reached the policy leaves no trace: the
  every-streams count from the act before it again.
Each (episode, step, key) goes up at most once, unless the worker refused it (then it may go
again, or inline). Frames are copied out of the camera rings on the event loop as soon as a
step is chosen (before the ring overwrites them), then fitted and encoded in worker threads.
A frame already overwritten, a camera without a frame at that step, or a step no longer held
is a declared loss: a skip, saying which, tells the worker never to wait for it, and it is
counted (never replaced by another frame).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import numpy as np

from robotd.contract import Camera
from robotd.frames import FrameError, fit_and_encode, to_wire
from robotd.lane.messages import Merged, Step
from robotd.link.observe import ObserveConnection, Signal
from robotd.link.posts import UplinkLimits
from robotd.link.steps import FrameLost, LinkCounters, StepReader
from robotd.link.windows import WindowPlanner

__all__ = ["Uplink", "UplinkLimits", "UplinkTap"]

log = logging.getLogger("robotd.link")


class UplinkTap(Protocol):
    """Told what went up (the trace: robotd.runtime.recorder). Called on the event loop;
    must return at once and must not keep or change what it is handed beyond reading it."""

    def posted(
        self, wep: str, step: int, frames: Mapping[str, Mapping[str, Any]],
        values: Mapping[str, Any],
    ) -> None:
        """Step `step`'s keys were posted: `frames` as encoded for the wire
        (robotd.frames.to_wire), `values` the other keys."""
        ...

    def refused(self, wep: str, step: int, keys: list[str]) -> None:
        """The worker refused a post."""
        ...


@dataclass(slots=True)
class _Job:
    """A step's keys chosen for upload: values, and frames copied out of the rings."""

    wep: str
    step: int
    values: dict[str, Any]
    pixels: dict[str, np.ndarray]


@dataclass
class _Episode:
    wep: str
    sent: dict[int, set[str]] = field(default_factory=dict)  # queued, sent or declared lost
    last_act: int | None = None  # the act asked last (the one in flight, if any)
    prev_act: int | None = None  # the act before it (restored if that one fails)
    predicted: int | None = None
    first: int | None = None
    newest: int = -1
    ask_step: int = 0
    ask_queue: int = 0
    floor: int = 0


class Uplink:
    """Uploads one daemon's observations to one worker's observe endpoint (module doc)."""

    def __init__(
        self,
        endpoint: str,
        planner: WindowPlanner,
        reader: StepReader,
        cameras: Mapping[str, Camera | None],
        counters: LinkCounters,
        *,
        timing: Literal["sync", "realtime"] = "sync",
        open_loop_horizon: int | None = None,
        merge: str = "replace",
        limits: UplinkLimits | None = None,
        when_behind: Literal["wait", "drop_oldest"] = "wait",
    ) -> None:
        self.planner = planner
        self.reader = reader
        self.cameras = cameras
        self.counters = counters
        self.timing, self.olh = timing, open_loop_horizon
        self.merge = merge
        self.conn = ObserveConnection(
            endpoint, counters, limits=limits, when_behind=when_behind, on_refused=self._refused
        )
        self._eps: dict[str, _Episode] = {}
        self._urgent: dict[str, frozenset[int]] = {}  # steps the act in flight reads
        self._jobs: tuple[deque[_Job], deque[_Job]] = (deque(), deque())  # urgent, in order
        self._job_ready = Signal()
        self.mispredicted = 0  # (step, key) pairs that went up only just before their act
        self.tap: UplinkTap | None = None  # told what went up (the trace)

    # ---- what the main process tells it -----------------------------------------------------

    def on_step(self, rec: Step) -> None:
        """A step was made: send what the next act will read of it."""
        ep = self._episode(rec.wep)
        s = rec.s
        ep.newest = max(ep.newest, s)
        if ep.first is None:
            ep.first = s
        keys = set(self.planner.every_keys_at(s, ep.last_act))
        target = self.predicted(ep.wep)
        if target is not None and s <= target:
            keys |= self.planner.needed(target, ep.last_act).get(s, frozenset())
        if keys:
            self._choose(ep, s, keys, urgent=False)

    def on_ask(self, wep: str, step: int, queue: int) -> None:
        """The control lane asked an act at `step` with `queue` rows left."""
        ep = self._episode(wep)
        ep.prev_act = ep.last_act
        ep.last_act, ep.predicted, ep.ask_step, ep.ask_queue = step, None, step, queue

    def on_chunk(self, msg: Merged) -> None:
        """The chunk answering the last act was merged: the next ask is known (realtime: when
        `msg.refill` rows remain); its window steps made so far go up."""
        ep = self._eps.get(msg.wep)
        if ep is None or ep.last_act is None or msg.from_step != ep.last_act:
            return
        at, rows, dropped = msg.at, msg.rows, msg.dropped
        if self.timing == "sync":
            ep.predicted = at + (rows if self.olh is None else min(rows, self.olh))
        else:
            left = max(0, ep.ask_queue - (at - ep.ask_step))
            if msg.stale:
                queued = left
            elif self.merge == "ensemble":
                queued = max(rows - dropped, left)
            else:
                queued = rows - dropped
            ep.predicted = at + max(0, queued - msg.refill)
        if ep.predicted <= ep.last_act:  # cannot happen on the wall clock; never plan on it
            ep.predicted = None
            return
        for step, keys in self.planner.needed(ep.predicted, ep.last_act).items():
            if step <= ep.newest:
                self._choose(ep, step, set(keys), urgent=False)

    def ensure(self, wep: str, needed: Mapping[int, frozenset[str]]) -> None:
        """Just before an act: send what its window reads and has not gone up, and move what
        it reads that is still queued (for encoding or sending) ahead of everything else.
        Until `settled`, the act's steps go past the limits: the act waits for them."""
        ep = self._episode(wep)
        self._urgent[wep] = frozenset(needed)
        jobs = self._jobs[1]
        moved = [j for j in jobs if j.wep == wep and j.step in needed]
        if moved:
            keep = [j for j in jobs if not (j.wep == wep and j.step in needed)]
            jobs.clear()
            jobs.extend(keep)
            self._jobs[0].extend(moved)
            self._job_ready.set()
        self.conn.promote(wep, needed)
        for step, keys in needed.items():
            self.mispredicted += self._choose(ep, step, set(keys), urgent=True)

    def settled(self, wep: str, step: int, handed: bool) -> None:
        """The act at `step` is over; `handed`: it reached the policy (answered, or failed
        there). If it did not, the every-streams count from the act before it again (the
        policy never saw these steps), and steps made since go up on that count."""
        self._urgent.pop(wep, None)
        ep = self._eps.get(wep)
        if ep is None or handed or ep.last_act != step:
            return
        ep.last_act, ep.predicted = ep.prev_act, None
        for s in range(step + 1, ep.newest + 1):
            keys = set(self.planner.every_keys_at(s, ep.last_act))
            if keys:
                self._choose(ep, s, keys, urgent=False)

    async def inline(self, wep: str, wanted: list[tuple[int, str]]) -> list[dict[str, Any]]:
        """Uploads for the act itself ({"step", "values", "frames"}), read back from the
        robot-side rings; FrameLost if a frame or step is no longer there."""
        by_step: dict[int, set[str]] = {}
        for step, key in wanted:
            by_step.setdefault(step, set()).add(key)
        jobs = []
        for step, keys in sorted(by_step.items()):
            got = self.reader.read(wep, step, keys)
            values, pixels, lost = got.values, got.frames, got.lost
            if lost:
                what = "; ".join(f"{k!r}: {why}" for k, why in lost)
                raise FrameLost(f"step {step}: {what}")
            jobs.append(_Job(wep, step, values, pixels))
        try:
            out = await anyio.to_thread.run_sync(lambda: [self._encode(j) for j in jobs])
        except FrameError as err:
            raise FrameLost(f"bad frame: {err}") from None
        self.counters.inline_frames += sum(len(j.pixels) for j in jobs)
        return [{"step": j.step, "values": j.values, "frames": f} for j, f in zip(jobs, out)]

    def predicted(self, wep: str) -> int | None:
        """The step the next act of `wep` is predicted at (None: not known yet)."""
        ep = self._eps.get(wep)
        if ep is None:
            return None
        return ep.predicted if ep.last_act is not None else ep.first

    def release_point(self, step: int) -> int:
        """Steps below this are read by no act after the act at `step`."""
        return max(0, step + 1 - self.planner.lookback)

    def released(self, wep: str, below: int) -> None:
        """The worker freed `wep`'s steps below `below` (an act was handed to the policy)."""
        ep = self._eps.get(wep)
        if ep is None or below <= ep.floor:
            return
        ep.floor = below
        for step in [s for s in ep.sent if s < below]:
            del ep.sent[step]
        self.conn.released(wep, below)

    def end(self, wep: str) -> None:
        """The worker-side episode ended: nothing more of it goes up."""
        self._eps.pop(wep, None)
        self.conn.end(wep)

    async def run(self) -> None:
        """Encode and upload until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.conn.run)
            tg.start_soon(self._encode_loop)

    # ---- choosing, reading, encoding --------------------------------------------------------

    def _episode(self, wep: str) -> _Episode:
        ep = self._eps.get(wep)
        if ep is None:
            for old in list(self._eps):  # a new worker-side episode: older ones are over
                self.end(old)
            ep = self._eps[wep] = _Episode(wep)
        return ep

    def _choose(
        self,
        ep: _Episode,
        step: int,
        keys: set[str],
        *,
        urgent: bool,
    ) -> int:
        """Queue the keys of `step` not gone up yet; returns how many that was."""
        if step < ep.floor:
            return 0
        sent = ep.sent.setdefault(step, set())
        keys -= sent
        if not keys:
            return 0
        sent |= keys
        got = self.reader.read(ep.wep, step, keys)
        values, pixels, lost = got.values, got.frames, got.lost
        by_reason: dict[str, list[str]] = {}
        for key, why in lost:
            by_reason.setdefault(why, []).append(key)
        for why, lost_keys in by_reason.items():
            self._skip(ep.wep, step, lost_keys, why)
        if values or pixels:
            self._jobs[0 if urgent else 1].append(_Job(ep.wep, step, values, pixels))
            self._job_ready.set()
        return len(keys)

    def _refused(self, wep: str, step: int, keys: list[str]) -> None:
        """The worker keeps none of a post: its keys may go up again (or inline)."""
        ep = self._eps.get(wep)
        sent = ep.sent.get(step) if ep is not None else None
        if sent is not None:
            sent.difference_update(keys)
        if self.tap is not None:
            try:
                self.tap.refused(wep, step, keys)
            except Exception:  # the trace's trouble never stops the uploads
                log.exception("the uplink's tap failed")

    def _skip(self, wep: str, step: int, keys: list[str], reason: str) -> None:
        if wep not in self._eps:  # the episode ended: the worker forgot it
            return
        frames = sum(self.reader.frames.has(k) for k in keys)
        self.conn.skip(wep, step, keys, frames, reason)

    def _encode(self, job: _Job) -> dict[str, Any]:
        """Fit and encode a job's frames (in a worker thread: cv2 releases the GIL)."""
        return {
            k: to_wire(fit_and_encode(px, self.cameras.get(k), name=k))
            for k, px in job.pixels.items()
        }

    async def _encode_loop(self) -> None:
        while True:
            while not (self._jobs[0] or self._jobs[1]):
                await self._job_ready.wait()
            urgent = bool(self._jobs[0])
            job = self._jobs[0 if urgent else 1].popleft()
            if job.wep not in self._eps:
                continue
            frames: dict[str, Any] = {}
            if job.pixels:  # one thread a step: faster than a thread a frame (measured)
                try:
                    frames = await anyio.to_thread.run_sync(self._encode, job)
                except FrameError as err:
                    self._skip(job.wep, job.step, sorted(job.pixels), f"bad frame: {err}")
                except Exception as err:  # never let one frame stop the uploads
                    log.exception("encoding step %d %s", job.step, sorted(job.pixels))
                    self._skip(job.wep, job.step, sorted(job.pixels), f"encoding failed: {err}")
            self._post(job, urgent, frames)

    def _post(self, job: _Job, urgent: bool, frames: dict[str, Any]) -> None:
        if job.wep not in self._eps:  # the episode ended meanwhile: nothing of it goes up
            return
        # An act may have been asked for this step while it was encoded.
        urgent = urgent or job.step in self._urgent.get(job.wep, ())
        if job.values or frames:
            self.conn.post(job.wep, job.step, job.values, frames, urgent=urgent)
            if self.tap is not None:
                try:
                    self.tap.posted(job.wep, job.step, frames, job.values)
                except Exception:  # the trace's trouble never stops the uploads
                    log.exception("the uplink's tap failed")
