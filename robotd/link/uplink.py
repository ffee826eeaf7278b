"""The daemon's side of the observe connection (SPEC §4): the steps some act will read go up
to the worker ahead of the acts, on a connection of their own.

What goes up when (`Uplink`, fed by the main process from the control lane's messages):
- every-stream keys as each step is made (the next act reads all of them);
- at-window keys of the *predicted* next ask: the prediction is formed when the previous
  act's chunk is merged (the control lane's "chunk" message): sync asks again when the
  chunk's min(rows, open_loop_horizon) rows have played; realtime when at most
  `refill_steps` rows remain. Window steps already made then go up at once (read back from
  the robot-side rings), later ones as they are made. Before an episode's first act, the
  first step is the predicted ask.
- `ensure`: just before an act, whatever its window reads that has not gone up (a
  misprediction); `inline`: what the worker still lacks, encoded for the act itself.
Each (episode, step, key) goes up at most once. Frames are copied out of the camera rings
on the event loop as soon as a step is chosen (before the ring overwrites them) and fitted
and encoded in worker threads. A frame already overwritten is a declared loss: a `skip` is
sent so the worker never waits for it, and it is counted, never replaced by another frame.

Flow control: posts are pipelined; the worker acknowledges each with `through` or refuses
it with a reason (counted in refused_frames, warned). What the worker holds for an episode
(posted, not yet released by an act) stays within `UplinkLimits`; over them `when_behind`
says: "wait" (posts wait for room; the act waits) or "drop_oldest" (the oldest pending post
is given up and declared skipped). Even "wait" gives up the oldest once a second limit's
worth is queued robot-side, so a stalled worker cannot exhaust the daemon's memory; and a
post an act waits for right now (`ensure`) goes regardless (only acts make room).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import numpy as np
import zmq
import zmq.asyncio

from robotd import wire
from robotd.contract import Camera
from robotd.link.fit import FrameError, fit_and_encode, to_wire
from robotd.link.session import FrameLost, LinkCounters, StepRing, step_value
from robotd.link.windows import WindowPlanner
from robotd.shm import FrameRing

log = logging.getLogger("robotd.link")

MB = 1 << 20
_WARN_EVERY_S = 5.0


@dataclass(frozen=True)
class UplinkLimits:
    """What one episode may hold on the worker (posted and not yet released)."""

    episode_frames: int = 1024
    episode_bytes: int = 64 * MB

    def within(self, worker: Mapping[str, int] | None) -> UplinkLimits:
        """These limits, lowered to what the worker said it keeps (hello's `limits`)."""
        w = worker or {}
        return UplinkLimits(
            min(self.episode_frames, w.get("episode_frames", 1 << 62)),
            min(self.episode_bytes, w.get("episode_bytes", 1 << 62)),
        )


@dataclass(slots=True)
class _Job:
    """A step's keys chosen for upload: values, and frames copied out of the rings."""

    wep: str
    step: int
    values: dict[str, Any]
    pixels: dict[str, np.ndarray]


@dataclass(slots=True)
class _Post:
    wep: str
    step: int
    keys: list[str]
    body: bytes
    frames: int
    rid: int
    skip: bool = False


@dataclass
class _Episode:
    wep: str
    sent: dict[int, set[str]] = field(default_factory=dict)  # queued, sent or declared lost
    last_act: int | None = None
    predicted: int | None = None
    first: int | None = None
    newest: int = -1
    ask_step: int = 0
    ask_queue: int = 0
    floor: int = 0
    held: dict[int, list[int]] = field(default_factory=dict)  # step -> [frames, bytes]
    frames: int = 0
    nbytes: int = 0
    through: int = -1


class _Signal:
    """Wake a waiting task; each wait() waits for the next set()."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()


class Uplink:
    """Uploads one daemon's observations to one worker's observe endpoint (module doc)."""

    def __init__(
        self,
        endpoint: str,
        planner: WindowPlanner,
        steps: StepRing,
        rings: Mapping[str, FrameRing],
        cameras: Mapping[str, Camera | None],
        counters: LinkCounters,
        *,
        timing: Literal["sync", "realtime"] = "sync",
        open_loop_horizon: int | None = None,
        refill_steps: int = 0,
        merge: str = "replace",
        limits: UplinkLimits | None = None,
        when_behind: Literal["wait", "drop_oldest"] = "wait",
    ) -> None:
        self.endpoint = endpoint
        self.planner = planner
        self.steps = steps
        self.rings = rings
        self.cameras = cameras
        self.counters = counters
        self.timing, self.olh, self.refill, self.merge = (
            timing,
            open_loop_horizon,
            refill_steps,
            merge,
        )
        self.limits = limits or UplinkLimits()
        self.when_behind = when_behind
        self._eps: dict[str, _Episode] = {}
        self._jobs: tuple[deque[_Job], deque[_Job]] = (deque(), deque())  # urgent, in order
        self._posts: tuple[deque[_Post], deque[_Post]] = (deque(), deque())
        self._unacked: dict[int, _Post] = {}
        self._rid = 0
        self._job_ready, self._post_ready, self._room = _Signal(), _Signal(), _Signal()
        self._warned: dict[str, tuple[float, int]] = {}
        self._sock: zmq.asyncio.Socket | None = None

    # ---- what the main process tells it -----------------------------------------------------

    def on_step(self, rec: Mapping[str, Any]) -> None:
        """A step was made: send what the next act will read of it."""
        ep = self._episode(str(rec["wep"]))
        s = int(rec["s"])
        ep.newest = max(ep.newest, s)
        if ep.first is None:
            ep.first = s
        keys = set(self.planner.every_keys_at(s, ep.last_act))
        target = ep.predicted if ep.last_act is not None else ep.first
        if target is not None and s <= target:
            keys |= self.planner.needed(target, ep.last_act).get(s, frozenset())
        if keys:
            self._choose(ep, s, keys, rec, urgent=False)

    def on_ask(self, wep: str, step: int, queue: int) -> None:
        """The control lane asked an act at `step` with `queue` rows left."""
        ep = self._episode(wep)
        ep.last_act, ep.predicted, ep.ask_step, ep.ask_queue = step, None, step, queue

    def on_chunk(self, msg: Mapping[str, Any]) -> None:
        """The chunk answering the last act was merged: the next ask is known; the window
        steps of it already made go up now."""
        ep = self._eps.get(str(msg.get("wep")))
        if ep is None or ep.last_act is None or msg.get("from") != ep.last_act:
            return
        at, rows, dropped = int(msg["at"]), int(msg["rows"]), int(msg.get("dropped", 0))
        if self.timing == "sync":
            ep.predicted = at + (rows if self.olh is None else min(rows, self.olh))
        else:
            left = max(0, ep.ask_queue - (at - ep.ask_step))
            if msg.get("stale"):
                queued = left
            elif self.merge == "ensemble":
                queued = max(rows - dropped, left)
            else:
                queued = rows - dropped
            ep.predicted = at + max(0, queued - self.refill)
        if ep.predicted <= ep.last_act:  # cannot happen on the wall clock; never plan on it
            ep.predicted = None
            return
        for step, keys in self.planner.needed(ep.predicted, ep.last_act).items():
            if step <= ep.newest:
                self._choose(ep, step, set(keys), self.steps.get(ep.wep, step), urgent=False)

    def ensure(self, wep: str, needed: Mapping[int, frozenset[str]]) -> None:
        """Just before an act: send, ahead of everything queued, what its window reads and
        has not gone up."""
        ep = self._episode(wep)
        for step, keys in needed.items():
            self._choose(ep, step, set(keys), self.steps.get(wep, step), urgent=True)

    async def inline(self, wep: str, wanted: list[tuple[int, str]]) -> list[dict[str, Any]]:
        """Uploads for the act itself ({"step", "values", "frames"}), read back from the
        robot-side rings; FrameLost if a frame or step is no longer there."""
        by_step: dict[int, set[str]] = {}
        for step, key in wanted:
            by_step.setdefault(step, set()).add(key)
        jobs = []
        for step, keys in sorted(by_step.items()):
            rec = self.steps.get(wep, step)
            values, pixels, lost = self._read(rec, keys)
            if lost:
                raise FrameLost(f"step {step} {sorted(lost)}: no longer held robot-side")
            jobs.append(_Job(wep, step, values, pixels))
        try:
            out = await anyio.to_thread.run_sync(lambda: [self._encode(j) for j in jobs])
        except FrameError as err:
            raise FrameLost(f"bad frame: {err}") from None
        self.counters.inline_frames += sum(len(j.pixels) for j in jobs)
        return [{"step": j.step, "values": j.values, "frames": f} for j, f in zip(jobs, out)]

    def release_point(self, step: int) -> int:
        """Steps below this are read by no act after the act at `step`."""
        return max(0, step + 1 - self.planner.lookback)

    def released(self, wep: str, below: int) -> None:
        """The worker freed `wep`'s steps below `below` (an act was handed to the policy)."""
        ep = self._eps.get(wep)
        if ep is None or below <= ep.floor:
            return
        ep.floor = below
        for step in [s for s in ep.held if s < below]:
            frames, nbytes = ep.held.pop(step)
            ep.frames -= frames
            ep.nbytes -= nbytes
        for step in [s for s in ep.sent if s < below]:
            del ep.sent[step]
        self._room.set()

    def end(self, wep: str) -> None:
        """The worker-side episode ended: nothing more of it goes up."""
        self._eps.pop(wep, None)
        self._room.set()

    # ---- choosing and reading ---------------------------------------------------------------

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
        rec: Mapping[str, Any] | None,
        *,
        urgent: bool,
    ) -> None:
        if step < ep.floor:
            return
        sent = ep.sent.setdefault(step, set())
        keys -= sent
        if not keys:
            return
        sent |= keys
        values, pixels, lost = self._read(rec, keys)
        if lost:
            self._skip(
                ep,
                step,
                lost,
                "no longer held robot-side"
                if rec is None
                else "frame overwritten in its camera ring before it was read",
            )
        if values or pixels:
            self._jobs[0 if urgent else 1].append(_Job(ep.wep, step, values, pixels))
            self._job_ready.set()

    def _read(
        self, rec: Mapping[str, Any] | None, keys: set[str]
    ) -> tuple[dict[str, Any], dict[str, np.ndarray], list[str]]:
        """(values, frame copies, keys lost) of a step record; frames from the rings."""
        values: dict[str, Any] = {}
        pixels: dict[str, np.ndarray] = {}
        lost: list[str] = []
        for key in sorted(keys):
            if rec is None:
                lost.append(key)
            elif key in self.rings:
                ref = (rec.get("cams") or {}).get(key)
                got = self.rings[key].read(int(ref[0])) if ref is not None else None
                if got is None:
                    lost.append(key)
                else:
                    pixels[key] = got[0]
            else:
                values[key] = step_value(rec, key)
        return values, pixels, lost

    def _skip(self, ep: _Episode, step: int, keys: list[str], reason: str) -> None:
        frames = sum(k in self.rings for k in keys)
        self.counters.skipped_frames += frames
        self._warn(
            "skipped",
            f"episode {ep.wep} step {step} {keys}: {reason}; declared "
            "skipped (an act reading it fails rather than read a wrong frame)",
        )
        self._rid += 1
        body = wire.packb(
            {
                "id": self._rid,
                "cmd": "skip",
                "episode": ep.wep,
                "step": step,
                "keys": keys,
                "reason": reason,
            }
        )
        self._posts[0].append(_Post(ep.wep, step, keys, body, 0, self._rid, skip=True))
        self._post_ready.set()

    def _encode(self, job: _Job) -> dict[str, Any]:
        """Fit and encode a job's frames (in a worker thread: cv2 releases the GIL)."""
        return {
            k: to_wire(fit_and_encode(px, self.cameras.get(k), name=k))
            for k, px in job.pixels.items()
        }

    def _warn(self, kind: str, message: str) -> None:
        """Log a loss at once, then at most every few seconds with the count in between."""
        now = time.monotonic()
        last, quiet = self._warned.get(kind, (0.0, 0))
        if now - last >= _WARN_EVERY_S:
            more = f" (+{quiet} more since the last warning)" if quiet else ""
            log.warning("upload %s: %s%s", kind, message, more)
            self._warned[kind] = (now, 0)
        else:
            self._warned[kind] = (last, quiet + 1)

    # ---- the tasks --------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect and upload until cancelled; the socket is closed on the way out."""
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
        sock.connect(self.endpoint)
        self._sock = sock
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._encode_loop)
                tg.start_soon(self._send_loop)
                tg.start_soon(self._receive_loop)
        finally:
            self._sock = None
            sock.close(linger=0)
            ctx.term()

    async def _encode_loop(self) -> None:
        while True:
            while not (self._jobs[0] or self._jobs[1]):
                await self._job_ready.wait()
            urgent = bool(self._jobs[0])
            job = self._jobs[0 if urgent else 1].popleft()
            if job.wep not in self._eps:
                continue
            try:
                frames = await anyio.to_thread.run_sync(self._encode, job)
            except FrameError as err:
                self._skip(self._eps[job.wep], job.step, sorted(job.pixels), f"bad frame: {err}")
                frames = {}
                if not job.values:
                    continue
            self._rid += 1
            body = wire.packb(
                {
                    "id": self._rid,
                    "cmd": "post",
                    "episode": job.wep,
                    "step": job.step,
                    "values": job.values,
                    "frames": frames,
                }
            )
            keys = sorted({*job.values, *frames})
            self._posts[0 if urgent else 1].append(
                _Post(job.wep, job.step, keys, body, len(frames), self._rid)
            )
            self._post_ready.set()

    async def _send_loop(self) -> None:
        assert self._sock is not None
        while True:
            post = await self._next_post()
            self._unacked[post.rid] = post
            await self._sock.send(post.body)
            if not post.skip:
                self.counters.uploaded_frames += post.frames
                self.counters.uploaded_bytes += len(post.body)

    async def _next_post(self) -> _Post:
        """The next post to send, once it fits within the limits (module doc)."""
        while True:
            queue = self._posts[0] if self._posts[0] else self._posts[1]
            if not queue:
                await self._post_ready.wait()
                continue
            post = queue[0]
            ep = self._eps.get(post.wep)
            if ep is None or post.step < ep.floor:
                queue.popleft()  # its episode is over, or no act reads it any more
                continue
            if post.skip:
                return queue.popleft()
            # An act waits for an urgent post right now, and only acts make room: it goes.
            if queue is self._posts[0] or self._fits(ep, post):
                queue.popleft()
                held = ep.held.setdefault(post.step, [0, 0])
                held[0] += post.frames
                held[1] += len(post.body)
                ep.frames += post.frames
                ep.nbytes += len(post.body)
                return post
            if self.when_behind == "drop_oldest" or self._queued_over_limit():
                self._give_up(self._oldest())
                continue
            await self._room.wait()

    def _fits(self, ep: _Episode, post: _Post) -> bool:
        if not ep.held:
            return True  # too big even alone: the worker refuses it and says why
        return (
            ep.frames + post.frames <= self.limits.episode_frames
            and ep.nbytes + len(post.body) <= self.limits.episode_bytes
        )

    def _queued_over_limit(self) -> bool:
        posts = [p for q in self._posts for p in q if not p.skip]
        return (
            sum(p.frames for p in posts) > self.limits.episode_frames
            or sum(len(p.body) for p in posts) > self.limits.episode_bytes
        )

    def _oldest(self) -> _Post:
        """The pending post of the lowest step (ties: the one queued first)."""
        posts = [(p.step, i, q) for q in self._posts for i, p in enumerate(q) if not p.skip]
        _, i, q = min(posts, key=lambda x: (x[0], x[1]))
        post = q[i]
        del q[i]
        return post

    def _give_up(self, post: _Post) -> None:
        self._skip(
            self._eps[post.wep],
            post.step,
            post.keys,
            f"uploads behind (over {self.limits.episode_frames} "
            f"frames or {self.limits.episode_bytes} bytes in flight), oldest given up",
        )

    async def _receive_loop(self) -> None:
        assert self._sock is not None
        while True:
            data = await self._sock.recv()
            try:
                reply = wire.unpackb(data)
                post = self._unacked.pop(reply["id"])
            except (wire.WireError, KeyError, TypeError):
                log.warning("observe connection: dropped an unexpected reply %.200r", data)
                continue
            self._acknowledged(post, reply)

    def _acknowledged(self, post: _Post, reply: dict[str, Any]) -> None:
        result = reply.get("result") if reply.get("ok") is True else None
        refused = reply.get("error") if result is None else result.get("refused")
        ep = self._eps.get(post.wep)
        if ep is not None and isinstance(result, dict) and isinstance(result.get("through"), int):
            ep.through = result["through"]
        if not refused:
            return
        reason = refused.get("message", refused) if isinstance(refused, dict) else refused
        if post.skip:
            log.warning("observe connection: skip of step %d refused: %s", post.step, reason)
            return
        self.counters.refused_frames += post.frames
        self._warn("refused", f"the worker refused step {post.step}: {reason}")
        if ep is not None and post.step in ep.held:  # the worker keeps none of it
            frames, nbytes = ep.held[post.step]
            ep.held[post.step] = [frames - post.frames, nbytes - len(post.body)]
            ep.frames -= post.frames
            ep.nbytes -= len(post.body)
            self._room.set()
