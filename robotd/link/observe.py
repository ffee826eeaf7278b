"""The daemon's observe connection to a worker (docs/protocol.md): pipelined uploads, their
acknowledgements, and flow control. What goes up, and when, is robotd.link.uplink's call.

Posts are sent in order (those an act waits for right now first) without waiting for the
previous one's acknowledgement; each acknowledgement updates `through` and may be a refusal
(counted in refused_frames and warned). What the worker holds for an episode (posted and not
yet released by an act) is mirrored here and kept within `UplinkLimits`; a post that does
not fit follows `when_behind`: "wait" (it waits for an act to make room) or "drop_oldest"
(the oldest pending post is given up and declared skipped). "wait" too gives up the oldest
once a second limit's worth is queued here, so a stalled worker cannot exhaust the daemon's
memory; and a post an act waits for right now always goes (only acts make room).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import anyio
import zmq
import zmq.asyncio

from robotd import wire
from robotd.link.session import LinkCounters

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
class Post:
    """One upload, packed: a post of `keys` at `step` (`frames` of them camera frames), or
    a skip declaration."""

    wep: str
    step: int
    keys: list[str]
    body: bytes
    frames: int
    rid: int
    skip: bool = False


@dataclass
class _Held:
    """The mirror of what the worker holds for one episode."""

    floor: int = 0
    steps: dict[int, list[int]] = field(default_factory=dict)  # step -> [frames, bytes]
    frames: int = 0
    nbytes: int = 0
    through: int = -1

    def add(self, step: int, frames: int, nbytes: int) -> None:
        held = self.steps.setdefault(step, [0, 0])
        held[0] += frames
        held[1] += nbytes
        self.frames += frames
        self.nbytes += nbytes


class Signal:
    """Wake a waiting task; each wait() waits for the next set()."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()


class ObserveConnection:
    """A DEALER to one worker's observe endpoint (module doc). Use from the event loop."""

    def __init__(
        self,
        endpoint: str,
        counters: LinkCounters,
        *,
        limits: UplinkLimits | None = None,
        when_behind: Literal["wait", "drop_oldest"] = "wait",
    ) -> None:
        self.endpoint = endpoint
        self.counters = counters
        self.limits = limits or UplinkLimits()
        self.when_behind = when_behind
        self._held: dict[str, _Held] = {}
        self._posts: tuple[deque[Post], deque[Post]] = (deque(), deque())  # urgent, in order
        self._unacked: dict[int, Post] = {}
        self._rid = 0
        self._post_ready, self._room = Signal(), Signal()
        self._warned: dict[str, tuple[float, int]] = {}
        self._sock: zmq.asyncio.Socket | None = None
        # When set to a list: (episode, step, keys, bytes) of every post sent (benchmarks).
        self.sent_log: list[tuple[str, int, tuple[str, ...], int]] | None = None

    # ---- what the uplink hands it -----------------------------------------------------------

    def post(self, wep: str, step: int, values: dict, frames: dict, *, urgent: bool) -> None:
        """Queue a post of `values` and encoded `frames` (robotd.link.fit.to_wire) at `step`."""
        self._rid += 1
        body = wire.packb(
            {
                "id": self._rid,
                "cmd": "post",
                "episode": wep,
                "step": step,
                "values": values,
                "frames": frames,
            }
        )
        keys = sorted({*values, *frames})
        self._posts[0 if urgent else 1].append(Post(wep, step, keys, body, len(frames), self._rid))
        self._held.setdefault(wep, _Held())
        self._post_ready.set()

    def skip(self, wep: str, step: int, keys: list[str], frames: int, reason: str) -> None:
        """Declare `keys` at `step` lost (`frames` of them camera frames): counted, warned,
        and told to the worker so that it never waits for them."""
        self.counters.skipped_frames += frames
        self.warn(
            "skipped",
            f"episode {wep} step {step} {keys}: {reason}; declared skipped "
            "(an act reading it fails rather than read a wrong frame)",
        )
        self._rid += 1
        body = wire.packb(
            {
                "id": self._rid,
                "cmd": "skip",
                "episode": wep,
                "step": step,
                "keys": keys,
                "reason": reason,
            }
        )
        self._posts[0].append(Post(wep, step, keys, body, 0, self._rid, skip=True))
        self._held.setdefault(wep, _Held())
        self._post_ready.set()

    def released(self, wep: str, below: int) -> None:
        """The worker freed `wep`'s steps below `below` (an act was handed to the policy)."""
        held = self._held.get(wep)
        if held is None or below <= held.floor:
            return
        held.floor = below
        for step in [s for s in held.steps if s < below]:
            frames, nbytes = held.steps.pop(step)
            held.frames -= frames
            held.nbytes -= nbytes
        self._room.set()

    def end(self, wep: str) -> None:
        """Nothing more of `wep` goes up; what is queued of it is dropped."""
        self._held.pop(wep, None)
        self._unacked = {rid: p for rid, p in self._unacked.items() if p.wep != wep}
        self._room.set()

    def through(self, wep: str) -> int:
        """The worker's last word on how far it holds everything posted of `wep`."""
        held = self._held.get(wep)
        return -1 if held is None else held.through

    def warn(self, kind: str, message: str) -> None:
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
        """Connect, send and read acknowledgements until cancelled; closes on the way out."""
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
        sock.connect(self.endpoint)
        self._sock = sock
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._send_loop)
                tg.start_soon(self._receive_loop)
        finally:
            self._sock = None
            sock.close(linger=0)
            ctx.term()

    async def _send_loop(self) -> None:
        assert self._sock is not None
        while True:
            post = await self._next_post()
            self._unacked[post.rid] = post
            await self._sock.send(post.body)
            if not post.skip:
                self.counters.uploaded_frames += post.frames
                self.counters.uploaded_bytes += len(post.body)
                if self.sent_log is not None:
                    self.sent_log.append((post.wep, post.step, tuple(post.keys), len(post.body)))

    async def _next_post(self) -> Post:
        """The next post to send, once it fits within the limits (module doc)."""
        while True:
            queue = self._posts[0] if self._posts[0] else self._posts[1]
            if not queue:
                await self._post_ready.wait()
                continue
            post = queue[0]
            held = self._held.get(post.wep)
            if held is None or post.step < held.floor:
                queue.popleft()  # its episode is over, or no act reads it any more
                continue
            if post.skip:
                return queue.popleft()
            if queue is self._posts[0] or self._fits(held, post):
                queue.popleft()
                held.add(post.step, post.frames, len(post.body))
                return post
            if self.when_behind == "drop_oldest" or self._queued_over_limit():
                self._give_up(self._oldest())
                continue
            await self._room.wait()

    def _fits(self, held: _Held, post: Post) -> bool:
        if not held.steps:
            return True  # too big even alone: the worker refuses it and says why
        return (
            held.frames + post.frames <= self.limits.episode_frames
            and held.nbytes + len(post.body) <= self.limits.episode_bytes
        )

    def _queued_over_limit(self) -> bool:
        posts = [p for q in self._posts for p in q if not p.skip]
        return (
            sum(p.frames for p in posts) > self.limits.episode_frames
            or sum(len(p.body) for p in posts) > self.limits.episode_bytes
        )

    def _oldest(self) -> Post:
        """The pending post of the lowest step (ties: the one queued first)."""
        posts = [(p.step, i, q) for q in self._posts for i, p in enumerate(q) if not p.skip]
        _, i, q = min(posts, key=lambda x: (x[0], x[1]))
        post = q[i]
        del q[i]
        return post

    def _give_up(self, post: Post) -> None:
        self.skip(
            post.wep,
            post.step,
            post.keys,
            post.frames,
            f"uploads behind (over {self.limits.episode_frames} frames or "
            f"{self.limits.episode_bytes} bytes in flight), oldest given up",
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

    def _acknowledged(self, post: Post, reply: dict) -> None:
        result = reply.get("result") if reply.get("ok") is True else None
        refused = reply.get("error") if result is None else result.get("refused")
        held = self._held.get(post.wep)
        if held is not None and isinstance(result, dict) and isinstance(result.get("through"), int):
            held.through = result["through"]
        if not refused:
            return
        reason = refused.get("message", refused) if isinstance(refused, dict) else refused
        if post.skip:
            log.warning("observe connection: skip of step %d refused: %s", post.step, reason)
            return
        self.counters.refused_frames += post.frames
        self.warn("refused", f"the worker refused step {post.step}: {reason}")
        if held is not None and post.step in held.steps:  # the worker keeps none of it
            held.add(post.step, -post.frames, -len(post.body))
            self._room.set()
