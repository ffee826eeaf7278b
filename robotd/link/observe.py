"""The daemon's observe connection to a worker (docs/protocol.md): pipelined uploads, their
acknowledgements, and flow control. What goes up, and when, is robotd.link.uplink's call.

Posts are sent in order (those an act waits for right now first: `urgent`, or moved there by
`promote`) without waiting for the previous one's acknowledgement; each acknowledgement
updates `through` and may be a refusal (counted in refused_frames, warned, and handed to
`on_refused` so that the refused keys can go up again or inline). A malformed
acknowledgement is warned about, naming the field, and dropped: nothing a worker answers
stops the connection. What the worker holds for an episode (posted and not yet released by
an act) is mirrored here and kept within `UplinkLimits`; a post that does not fit waits for
an act to make room, and meanwhile:
- "wait": nothing is given up, unless more than two limits' worth is queued here (so a
  stalled worker cannot exhaust the daemon's memory): then the oldest pending post goes;
- "drop_oldest": while what the worker holds plus what waits here is over the limit, the
  oldest pending (not yet sent) post is given up, so the newest wait; the newest is kept.
Every post given up is declared skipped, counted and warned. A post an act waits for right
now always goes at once (only acts make room; the worker refuses what it cannot keep).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Container
from typing import Any, Literal

import anyio
import zmq
import zmq.asyncio

from robotd import wire
from robotd.link.posts import Held, Post, UplinkLimits, parse_ack, stray_words
from robotd.link.steps import LinkCounters
from robotd.recent import Recent
from robotd.repeats import Repeats

log = logging.getLogger("robotd.link")

_WARN_EVERY_S = 5.0
ENDED_KEPT = 1024  # answers still expected from ended episodes' uploads (more: strays)


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
    """A DEALER to one worker's observe endpoint (module doc). Use from the event loop.

    `on_refused(episode, step, keys)`: called for each post the worker refused (nothing of
    it is kept there)."""

    def __init__(
        self,
        endpoint: str,
        counters: LinkCounters,
        *,
        limits: UplinkLimits | None = None,
        when_behind: Literal["wait", "drop_oldest"] = "wait",
        on_refused: Callable[[str, int, list[str]], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.counters = counters
        self.limits = limits or UplinkLimits()
        self.when_behind = when_behind
        self.on_refused = on_refused
        self._held: dict[str, Held] = {}
        self._posts: tuple[deque[Post], deque[Post]] = (deque(), deque())  # urgent, in order
        self._unacked: dict[int, Post] = {}
        # uploads whose episode ended before their answer came, by id: that answer is
        # expected, not a stray
        self._ended: Recent[int, str] = Recent(ENDED_KEPT)
        self._rid = 0
        # One signal for "a post was queued" and "room was made": the send loop waits on
        # both at once (an urgent post must go even while an ordinary one waits for room).
        self._wake = Signal()
        self._warned = Repeats(_WARN_EVERY_S)
        self._sock: zmq.asyncio.Socket | None = None
        # When set to a list: (episode, step, keys, bytes) of every post sent (benchmarks).
        self.sent_log: list[tuple[str, int, tuple[str, ...], int]] | None = None
        self.given_up = 0  # posts given up because uploads were behind

    # ---- what the uplink hands it -----------------------------------------------------------

    def post(self, wep: str, step: int, values: dict, frames: dict, *, urgent: bool) -> None:
        """Queue a post of `values` and encoded `frames` (robotd.frames.to_wire) at `step`."""
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
        self._held.setdefault(wep, Held())
        self._wake.set()

    def skip(self, wep: str, step: int, keys: list[str], frames: int, reason: str) -> None:
        """Declare `keys` at `step` lost (`frames` of them camera frames): counted, warned,
        and told to the worker so that it never waits for them."""
        self.counters.skipped_frames += frames
        self.warn(
            "skipped",
            f"episode {wep} step {step} {keys}: {reason}; declared skipped "
            "(an act reading it gets it inline if still held robot-side, else fails rather "
            "than read a wrong frame)",
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
        self._held.setdefault(wep, Held())
        self._wake.set()

    def promote(self, wep: str, steps: Container[int]) -> int:
        """An act reads `steps` of `wep` right now: their queued posts go ahead of the rest,
        whatever the limits. Returns how many posts moved."""
        urgent, ordered = self._posts
        moved = [p for p in ordered if p.wep == wep and p.step in steps]
        if moved:
            keep = [p for p in ordered if not (p.wep == wep and p.step in steps)]
            ordered.clear()
            ordered.extend(keep)
            urgent.extend(moved)
            self._wake.set()
        return len(moved)

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
        self._wake.set()

    def end(self, wep: str) -> None:
        """Nothing more of `wep` goes up; what is queued of it is dropped."""
        self._held.pop(wep, None)
        for rid in [rid for rid, p in self._unacked.items() if p.wep == wep]:
            del self._unacked[rid]
            self._ended.add(rid, wep)
        self._wake.set()

    def through(self, wep: str) -> int:
        """The worker's last word on how far it holds everything posted of `wep`."""
        held = self._held.get(wep)
        return -1 if held is None else held.through

    def held(self, wep: str) -> tuple[int, int]:
        """(frames, bytes) the worker is believed to hold of `wep` (the mirror)."""
        held = self._held.get(wep)
        return (0, 0) if held is None else (held.frames, held.nbytes)

    def warn(self, kind: str, message: str) -> None:
        """Log a loss at once, then at most every few seconds with the count in between."""
        said = self._warned.say(kind)
        if said is not None:
            log.warning("upload %s: %s%s", kind, message, said.tail)

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
        """The next post to send, once it may go (module doc)."""
        while True:
            post = self._take()
            if post is not None:
                return post
            await self._wake.wait()

    def _take(self) -> Post | None:
        """The next post that may go now; None if none is queued or the first in order must
        wait for room (given up instead, and the next looked at, when behind)."""
        urgent, ordered = self._posts
        while urgent:
            post = urgent.popleft()
            held = self._live(post)
            if held is not None:
                if not post.skip:
                    held.add(post.step, post.frames, len(post.body))
                return post
        while ordered:
            post = ordered[0]
            held = self._live(post)
            if held is None:
                ordered.popleft()  # its episode is over, or no act reads it any more
                continue
            if post.skip or self._fits(held, post):
                ordered.popleft()
                if not post.skip:
                    held.add(post.step, post.frames, len(post.body))
                return post
            victim = self._behind(held)
            if victim is None:
                return None
            ordered.remove(victim)
            self._give_up(victim)
        return None

    def _live(self, post: Post) -> Held | None:
        held = self._held.get(post.wep)
        return None if held is None or post.step < held.floor else held

    def _fits(self, held: Held, post: Post) -> bool:
        if not held.steps:
            return True  # too big even alone: the worker refuses it and says why
        return (
            held.frames + post.frames <= self.limits.episode_frames
            and held.nbytes + len(post.body) <= self.limits.episode_bytes
        )

    def _behind(self, held: Held) -> Post | None:
        """The pending post to give up now (module doc), or None: the first waits for room."""
        posts = [p for p in self._posts[1] if not p.skip]
        frames = sum(p.frames for p in posts)
        nbytes = sum(len(p.body) for p in posts)
        most_frames, most_bytes = 2 * self.limits.episode_frames, 2 * self.limits.episode_bytes
        if self.when_behind == "drop_oldest":
            frames, nbytes = frames + held.frames, nbytes + held.nbytes
            most_frames, most_bytes = self.limits.episode_frames, self.limits.episode_bytes
            posts = posts[:-1]  # the newest waits for room
        if not posts or (frames <= most_frames and nbytes <= most_bytes):
            return None
        return min(posts, key=lambda p: p.step)  # min() keeps the first queued of a tie

    def _give_up(self, post: Post) -> None:
        self.given_up += 1
        lim = self.limits
        why = (
            f"uploads behind (the worker holds {self.held(post.wep)[0]} frames, "
            f"{self.held(post.wep)[1]} bytes; limit {lim.episode_frames} frames, "
            f"{lim.episode_bytes} bytes per episode), oldest pending given up"
        )
        if self.when_behind == "wait":
            why += f" (more than two limits' worth queued: {len(self._posts[1])} posts)"
        self.skip(post.wep, post.step, post.keys, post.frames, why)

    async def _receive_loop(self) -> None:
        assert self._sock is not None
        while True:
            data = await self._sock.recv()
            try:
                reply: Any = wire.unpackb(data)
            except wire.WireError as err:
                reply = err
            rid = reply.get("id") if isinstance(reply, dict) else None
            post = self._unacked.pop(rid, None) if type(rid) is int else None  # not a bool
            if post is None and type(rid) is int and (wep := self._ended.pop(rid)) is not None:
                log.debug("observe connection: upload %d of ended episode %r answered", rid, wep)
                continue
            if post is None:
                self.counters.unknown_acks += 1
                self.warn("unexpected reply", stray_words(reply, len(data), self._rid))
                continue
            try:
                self._acknowledged(post, reply)
            except Exception:  # a bug here must not stop the uploads
                log.exception("observe connection: acknowledgement of step %d", post.step)

    def _acknowledged(self, post: Post, reply: dict) -> None:
        try:
            through, refused = parse_ack(reply, post)
        except ValueError as err:
            self.warn(
                "bad acknowledgement",
                f"dropped the worker's answer to the {'skip' if post.skip else 'post'} of "
                f"episode {post.wep} step {post.step}: {err}",
            )
            return
        held = self._held.get(post.wep)
        if held is not None and through is not None:
            held.through = through
        if refused is None:
            return
        if post.skip:
            log.warning("observe connection: skip of step %d refused: %s", post.step, refused)
            return
        self.counters.refused_frames += post.frames
        self.warn("refused", f"the worker refused step {post.step}: {refused}")
        if held is not None and post.step in held.steps:  # the worker keeps none of it
            held.add(post.step, -post.frames, -len(post.body))
            self._wake.set()
        if self.on_refused is not None:
            self.on_refused(post.wep, post.step, list(post.keys))
