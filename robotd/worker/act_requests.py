"""The worker's act socket: each request parsed and answered at once (hello, ping, params,
malformed ones), handed to the copies (act, end_episode), or parked until the uploads it
reads have arrived (docs/protocol.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from robotd import framed, wire
from robotd.stream.router import StreamRouter
from robotd.worker import commands
from robotd.worker.params import ParamError, params_to_wire
from robotd.worker.pool import MAX_QUEUED, Busy, Pool
from robotd.worker.requests import BadRequest, rtc_value
from robotd.worker.slots import Task, error
from robotd.worker.store import FrameStore

log = logging.getLogger("robotd.worker")


@dataclass(slots=True)
class Parked:
    """An act naming steps the store does not hold yet."""

    task: Task
    reads: list[list[str]]
    inline: dict[int, dict[str, Any]]
    release_below: int | None
    deadline: float
    wait_s: float = 0.0


class FramedRoute(list):
    """The route of a request that came framed (protocol 2): its reply may be framed too.
    A request of one frame is answered in one frame, as protocol 1 wants."""


class ActRequests:
    """Answers the act socket `router`; `hello(observe, protocol)` makes the hello result
    and `health(episode)` the ping result."""

    def __init__(
        self,
        router: zmq.Socket | StreamRouter,
        pool: Pool,
        store: FrameStore,
        windowed: bool,
        stream_wait_s: float,
        hello: Callable[[bool, int], dict[str, Any]],
        health: Callable[[str | None], dict[str, Any]],
    ) -> None:
        self.router, self.pool, self.store = router, pool, store
        self.windowed, self.stream_wait_s = windowed, stream_wait_s
        self.hello, self.health = hello, health
        self.parked: list[Parked] = []

    def send(self, route: list[bytes], reply: dict[str, Any]) -> None:
        """`reply` to `route`: framed if the request was (large arrays as frames of their
        own, a frame the copy sent passed on as it is), else one frame."""
        try:
            if isinstance(route, FramedRoute):
                frames = framed.pack(reply)
            else:
                frames = [wire.packb(reply)]
        except wire.WireError as err:  # a copy's answer that does not travel
            text = f"cannot send the answer: {err}"
            frames = [wire.packb(error(reply.get("id"), "internal", text))]
        self.router.send_multipart([*route, *frames], copy=False)

    def handle(self, frames: list[Any]) -> None:
        """Answer, queue or park one request (ROUTER frames: the peer, REQ's empty
        delimiter if any, then the message's frames); every failure is an error reply."""
        identity = bytes(frames[0])
        if len(frames) > 2 and not memoryview(frames[1]).nbytes:  # a REQ socket's delimiter
            route, message = [identity, b""], frames[2:]
        else:
            route, message = [identity], frames[1:]
        if len(message) > 1:
            route = FramedRoute(route)
        if not message:
            self.send(route, error(None, "bad_request", "request has no frames"))
            return
        rid = None
        try:
            request = commands.decode(message)
            rid = request.id
            result = self._parse(request, route)
            if isinstance(result, Task):
                self.pool.submit(result)
            elif isinstance(result, Parked):
                self.try_parked(result)
            elif result is not None:  # answered without the copies
                self.send(route, {"id": rid, "ok": True, "result": result})
        except commands.Refused as err:
            self.send(route, error(err.rid, err.code, str(err)))
        except BadRequest as err:
            self.send(route, error(rid, err.code, str(err), **err.extra))
        except Busy:
            self.send(route, error(rid, "busy", f"{MAX_QUEUED} requests already wait"))

    def _parse(
        self, request: commands.Request, route: list[bytes]
    ) -> Task | Parked | dict[str, Any] | None:
        if isinstance(request, commands.Act):
            return self._act(request, route)
        if isinstance(request, commands.Hello):
            return self.hello(request.observe is True, request.protocol)
        if isinstance(request, commands.Ping):
            return self.health(request.episode)
        if isinstance(request, commands.Params):
            return self._params(request)
        self._end(request.episode)
        return Task("end", route, request.id, request.episode)

    def _act(self, act: commands.Act, route: list[bytes]) -> Task | Parked:
        commands.check_steps(act, self.windowed)
        rid, episode = act.id, act.episode
        rtc = rtc_value(act.rtc)
        if act.reads is None:  # observations inline, as sent before uploads existed
            observations = commands.inline_observations(act)
            return Task(
                "act", route, rid, episode, act.step, act.steps, observations, rtc, act.task
            )
        reads, inline = commands.named_window(act)
        wait_s = self.stream_wait_s if act.wait_s is None else act.wait_s
        task = Task("act", route, rid, episode, act.step, act.steps, rtc=rtc, task=act.task)
        if episode in self.pool.lost:
            return task  # answered at once: no use waiting for its uploads
        return Parked(task, reads, inline, act.release_below, time.monotonic() + wait_s, wait_s)

    def _params(self, request: commands.Params) -> dict[str, Any]:
        values = self.pool.params_next
        change = commands.params_change(request)
        if change is not commands.UNSET:
            try:
                values = self.pool.set_params(change)
            except ParamError as err:
                raise BadRequest("bad_params", str(err)) from None
            log.info("params for the next episodes: %s", values)
        return {
            "params": params_to_wire(self.pool.copies.declared, values),
            "applies": "next_episode",
        }

    # ---- acts waiting for their uploads ----------------------------------------------------

    def poll_ms(self, longest: int) -> int:
        if not self.parked:
            return longest
        left = min(p.deadline for p in self.parked) - time.monotonic()
        return max(0, min(longest, int(left * 1e3) + 1))

    def try_parked(self, act: Parked) -> bool:
        """Hand `act` to the copies if the store holds its window, answer it if some step will
        never come or its wait is over, else park it. True when it left the parked list."""
        task = act.task
        look = self.store.lookup(task.episode, task.steps or [], act.reads, act.inline)
        if look.observations is not None:
            task.observations = look.observations
            self.pool.submit(task)
            if act.release_below is not None:
                self.store.release(task.episode, act.release_below)
            return True
        expired = time.monotonic() >= act.deadline
        if look.lost or expired:
            missing = [[s, k, reason] for s, k, reason in look.lost]
            late = f"not arrived within {act.wait_s:g} s" if expired else "not arrived yet"
            missing += [[s, k, late] for s, k in look.waiting]
            text = ", ".join(f"step {s} {k!r} ({why})" for s, k, why in missing[:8])
            more = f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""
            message = (
                f"act at step {task.step} of episode {task.episode!r}: missing {text}"
                f"{more}; send them inline"
            )
            self.send(task.route, error(task.rid, "missing_steps", message, missing=missing))
            return True
        if act not in self.parked:
            if len(self.parked) + self.pool.queued() >= MAX_QUEUED:
                raise Busy
            self.parked.append(act)
        return False

    def recheck(self, episode: str) -> None:
        for act in [p for p in self.parked if p.task.episode == episode]:
            try:
                left = self.try_parked(act)
            except Busy:
                task = act.task
                self.send(task.route, error(task.rid, "busy", f"{MAX_QUEUED} requests wait"))
                left = True
            if left:
                self.parked.remove(act)

    def expire(self) -> None:
        """Answer the parked acts whose wait is over, or whose episode was lost meanwhile."""
        for act in [p for p in self.parked if p.task.episode in self.pool.lost]:
            self.parked.remove(act)
            self.pool.submit(act.task)  # answered episode_lost at once
        now = time.monotonic()
        for episode in {p.task.episode for p in self.parked if p.deadline <= now}:
            self.recheck(episode)

    def _end(self, episode: str) -> None:
        """end_episode: free the episode's frames; its parked acts can never complete."""
        self.store.drop(episode)
        for act in [p for p in self.parked if p.task.episode == episode]:
            self.parked.remove(act)
            task = act.task
            message = (
                f"episode {episode!r} ended while the act at step {task.step} waited for its steps"
            )
            self.send(task.route, error(task.rid, "episode_ended", message))
