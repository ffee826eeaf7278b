"""The reference policy worker: serves one policy over ZeroMQ (docs/protocol.md).

Threads and sockets:
- The calling thread owns every socket and runs one poll loop: the act ROUTER that clients'
  DEALERs talk to, the observe ROUTER that daemons upload observations to (SPEC §4), and an
  inproc PAIR on which the policy thread hands back its replies. Requests are parsed and
  checked here, so a malformed one is answered at once even while the policy computes.
- Uploads go into the frame store (robotd.worker.store). An act that names steps not yet
  uploaded is parked, never blocking the loop: each upload re-checks the parked acts of its
  episode, and an act still incomplete after its wait (default 10 s) is answered
  `missing_steps`, naming them, so that the daemon sends them inline.
- One policy thread makes every call into the PolicyHost (episode bookkeeping, reset,
  frame decoding, infer, on_episode_end) in dispatch order, one at a time.
- A decoder thread decodes each uploaded frame as it is kept, ahead of the act that reads it
  (within StoreLimits.decoded_bytes), so that the policy thread mostly finds it done.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from robotd import wire
from robotd.worker.policy_host import Decoder, PolicyHost
from robotd.worker.policy_loop import Job, PolicyLoop, drop_queued, reply_error, send
from robotd.worker.requests import (
    BadRequest,
    act_fields,
    episode_field,
    named_act_fields,
    observe_endpoint,
    prepare_ipc,
    remove_ipc,
    request_id,
    upload_fields,
)
from robotd.worker.store import DecodeBudget, FrameStore, StoreLimits

log = logging.getLogger("robotd.worker")

PROTOCOL = 1
MAX_QUEUED = 64  # requests waiting for the policy thread (or parked); beyond that: "busy"
_POLL_MS = 100  # how often the loop looks at `stop`


@dataclass(slots=True)
class _Parked:
    """An act naming steps the store does not hold yet."""

    job: Job
    reads: list[list[str]]
    inline: dict[int, dict[str, Any]]
    release_below: int | None
    deadline: float
    wait_s: float = 0.0


def serve(
    policy: str,
    bind: str,
    *,
    policy_kwargs: dict[str, Any] | None = None,
    ready: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    observe: str | None = None,
    limits: StoreLimits | None = None,
    stream_wait_s: float = 10.0,
) -> None:
    """Load `policy` (MODULE:CLASS) and serve it on `bind` until `stop` is set.

    The observe socket binds `observe`, by default derived from `bind` (see
    `observe_endpoint`). `ready(endpoint)` is called once both listen, with the act endpoint
    bound (for tcp://host:0, the port actually chosen). `limits` bound the frame store;
    `stream_wait_s` is how long an act waits for its steps unless it says otherwise. Raises
    PolicyLoadError if the policy cannot be loaded, zmq.ZMQError if an endpoint cannot be
    bound. Without `stop`, serves until SIGTERM (handled when called from the main thread)
    or KeyboardInterrupt.
    """
    host = PolicyHost(policy, policy_kwargs)
    server = _Server(host, limits or StoreLimits(), stream_wait_s)
    observe = observe or observe_endpoint(bind)
    if stop is not None:
        server.run(bind, observe, ready, stop)
        return
    stop = threading.Event()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set()) if in_main else None
    try:
        server.run(bind, observe, ready, stop)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


class _Server:
    def __init__(self, host: PolicyHost, limits: StoreLimits, stream_wait_s: float) -> None:
        self.host = host
        self.decoder = Decoder(host, DecodeBudget(limits.decoded_bytes))
        streams = host.observations.streams if host.observations is not None else None
        self.store = FrameStore(limits, keys=streams, on_frame=self.decoder.submit)
        self.stream_wait_s = stream_wait_s
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=MAX_QUEUED)
        self.parked: list[_Parked] = []
        self.observe_ep: str | None = None
        self.router: zmq.Socket | None = None  # the act socket, set by run()
        self.hello = {
            "protocol": PROTOCOL,
            "contract": {
                "observations": host.observations.to_wire() if host.observations else None,
                "actions": host.actions.to_wire() if host.actions else None,
            },
            "endpoints": {"observe": None},
            "limits": self.store.limits.to_wire(),
            "policy": host.spec,
        }

    def run(
        self, bind: str, observe: str, ready: Callable[[str], None] | None, stop: threading.Event
    ) -> None:
        ctx = zmq.Context()
        router, obs = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
        for sock in (router, obs):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
        done = ctx.socket(zmq.PAIR)
        done_addr = f"inproc://robotd-worker-done-{id(self)}"
        done.bind(done_addr)
        thread = threading.Thread(
            target=PolicyLoop(self.host, ctx, done_addr, self.jobs).run,
            name="robotd-policy",
            daemon=True,
        )
        bound: list[str] = []
        try:
            for sock, ep in ((router, bind), (obs, observe)):
                prepare_ipc(ep)
                sock.bind(ep)
                bound.append(sock.getsockopt_string(zmq.LAST_ENDPOINT))
            self.observe_ep = bound[1]
            thread.start()
            self.decoder.start()
            # stdout, not the log: the one line a supervisor or a user waits for.
            print(
                f"robotd worker: policy {self.host.spec} listening on {bound[0]} "
                f"(observe {bound[1]})",
                flush=True,
            )
            if ready is not None:
                ready(bound[0])
            self._loop(router, obs, done, stop, thread)
        finally:
            self.decoder.stop()
            if thread.is_alive():
                drop_queued(self.jobs)  # shutting down: unanswered requests time out
                self.jobs.put(None)
                thread.join(timeout=5.0)
            for sock in (router, obs, done):
                sock.close(linger=0)
            for ep in bound:
                remove_ipc(ep)
            if thread.is_alive():  # a hung infer keeps its socket: don't wait on term()
                log.warning("policy thread still busy at shutdown; leaving it behind")
            else:
                ctx.term()

    def _loop(
        self,
        router: zmq.Socket,
        obs: zmq.Socket,
        done: zmq.Socket,
        stop: threading.Event,
        thread: threading.Thread,
    ) -> None:
        self.router = router
        poller = zmq.Poller()
        for sock in (router, obs, done):
            poller.register(sock, zmq.POLLIN)
        while not stop.is_set():
            if not thread.is_alive():
                raise RuntimeError("the policy thread died; see the log above")
            ready = dict(poller.poll(self._poll_ms()))
            if done in ready:
                while _drain_one(done, router):
                    pass
            if obs in ready:
                touched = {self._handle_observe(obs, frames) for frames in _recv_all(obs)}
                for episode in touched - {None}:
                    self._recheck(episode)
            if router in ready:
                for frames in _recv_all(router):
                    self._handle(router, frames)
            self._expire()

    def _poll_ms(self) -> int:
        if not self.parked:
            return _POLL_MS
        left = min(p.deadline for p in self.parked) - time.monotonic()
        return max(0, min(_POLL_MS, int(left * 1e3) + 1))

    # ---- the act socket ---------------------------------------------------------------------

    def _handle(self, router: zmq.Socket, frames: list[bytes]) -> None:
        """Answer, queue or park one request; every failure becomes an error reply."""
        route, body = frames[:-1], frames[-1]
        if len(route) not in (1, 2) or (len(route) == 2 and route[1] != b""):
            reply_error(
                router,
                frames[:1],
                None,
                "bad_request",
                f"request must be one frame, got {len(frames) - 1}",
            )
            return
        rid = None
        try:
            msg = wire.unpackb(body)
            rid = request_id(msg)
            result = self._parse(msg, route, rid)
            if isinstance(result, Job):
                self.jobs.put_nowait(result)
            elif isinstance(result, _Parked):
                self._try(result)
            else:  # answered without the policy (hello)
                send(router, route, {"id": rid, "ok": True, "result": result})
        except BadRequest as err:
            reply_error(router, route, rid, err.code, str(err), err.extra)
        except wire.WireError as err:
            reply_error(router, route, None, "bad_request", f"request is not msgpack: {err}")
        except queue.Full:
            reply_error(
                router, route, rid, "busy", f"{MAX_QUEUED} requests already wait for the policy"
            )

    def _parse(
        self, msg: dict[str, Any], route: list[bytes], rid: int
    ) -> Job | _Parked | dict[str, Any]:
        """A job for the policy thread, an act to look up, or the result of a request
        answered at once."""
        cmd = msg.get("cmd")
        if not isinstance(cmd, str):
            raise BadRequest("bad_request", f"field 'cmd': missing or not a string ({cmd!r})")
        if cmd == "hello":
            if msg.get("observe") is True:
                return {**self.hello, "endpoints": {"observe": self.observe_ep}}
            return self.hello
        if cmd == "end_episode":
            episode = episode_field(msg)
            self._end(episode)
            return Job("end", route, rid, episode)
        if cmd == "act":
            episode = episode_field(msg)
            windowed = self.host.observations is not None
            if "reads" not in msg:  # observations inline, as sent before uploads existed
                step, steps, observations = act_fields(msg, windowed)
                return Job(
                    "act", route, rid, episode, step, steps, observations, time.perf_counter()
                )
            step, steps, reads, inline, below, wait_s = named_act_fields(
                msg, windowed, self.stream_wait_s
            )
            job = Job("act", route, rid, episode, step, steps, None, time.perf_counter())
            return _Parked(job, reads, inline, below, time.monotonic() + wait_s, wait_s)
        raise BadRequest(
            "unknown_command",
            f"field 'cmd': unknown command {cmd[:64]!r} (hello, act, end_episode)",
        )

    def _try(self, act: _Parked) -> bool:
        """Dispatch `act` if the store holds its window, answer it if some step will never
        come or its wait is over, else park it. True when it left the parked list."""
        job = act.job
        look = self.store.lookup(job.episode, job.steps or [], act.reads, act.inline)
        if look.observations is not None:
            job.observations = look.observations
            self.jobs.put_nowait(job)
            if act.release_below is not None:
                self.store.release(job.episode, act.release_below)
            return True
        expired = time.monotonic() >= act.deadline
        if look.lost or expired:
            missing = [[s, k, reason] for s, k, reason in look.lost]
            late = f"not arrived within {act.wait_s:g} s" if expired else "not arrived yet"
            missing += [[s, k, late] for s, k in look.waiting]
            text = ", ".join(f"step {s} {k!r} ({why})" for s, k, why in missing[:8])
            more = f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""
            reply_error(
                self.router,
                job.route,
                job.rid,
                "missing_steps",
                f"act at step {job.step} of episode {job.episode!r}: missing {text}"
                f"{more}; send them inline",
                {"missing": missing},
            )
            return True
        if act not in self.parked:
            if len(self.parked) >= MAX_QUEUED:
                raise queue.Full
            self.parked.append(act)
        return False

    def _recheck(self, episode: str) -> None:
        for act in [p for p in self.parked if p.job.episode == episode]:
            try:
                left = self._try(act)
            except queue.Full:
                reply_error(
                    self.router,
                    act.job.route,
                    act.job.rid,
                    "busy",
                    f"{MAX_QUEUED} requests already wait for the policy",
                )
                left = True
            if left:
                self.parked.remove(act)

    def _expire(self) -> None:
        now = time.monotonic()
        for episode in {p.job.episode for p in self.parked if p.deadline <= now}:
            self._recheck(episode)

    def _end(self, episode: str) -> None:
        """end_episode: free the episode's frames; its parked acts can never complete."""
        self.store.drop(episode)
        for act in [p for p in self.parked if p.job.episode == episode]:
            self.parked.remove(act)
            reply_error(
                self.router,
                act.job.route,
                act.job.rid,
                "episode_ended",
                f"episode {episode!r} ended while the act at step {act.job.step} "
                "waited for its steps",
            )

    # ---- the observe socket -----------------------------------------------------------------

    def _handle_observe(self, sock: zmq.Socket, frames: list[bytes]) -> str | None:
        """Keep one upload (post) or skip declaration and acknowledge it; returns the episode
        it touched (its parked acts are looked at again)."""
        route, body = frames[:-1], frames[-1]
        rid = None
        if len(route) != 1:
            reply_error(
                sock,
                frames[:1],
                None,
                "bad_request",
                f"upload must be one frame, got {len(frames) - 1}",
            )
            return None
        try:
            msg = wire.unpackb(body)
            rid = request_id(msg)
            result = self._observe(msg, route[0], len(body))
        except BadRequest as err:
            reply_error(sock, route, rid, err.code, str(err))
            return None
        except wire.WireError as err:
            reply_error(sock, route, None, "bad_request", f"upload is not msgpack: {err}")
            return None
        send(sock, route, {"id": rid, "ok": True, "result": result})
        return result["episode"]

    def _observe(self, msg: dict[str, Any], owner: bytes, size: int) -> dict[str, Any]:
        up = upload_fields(msg)
        result: dict[str, Any] = {"episode": up.episode, "step": up.step, "refused": None}
        if up.cmd == "post":
            through, refusal = self.store.post(owner, up.episode, up.step, up.values, size)
        else:
            through, refusal = self.store.skip(owner, up.episode, up.step, up.keys, up.reason)
        if refusal is not None:
            log.warning("upload refused: %s", refusal.message)
            result["refused"] = {"code": refusal.code, "message": refusal.message}
        result["through"] = through
        return result


def _recv_all(sock: zmq.Socket) -> list[list[bytes]]:
    """Every message waiting on `sock`, without blocking."""
    out = []
    while True:
        try:
            out.append(sock.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            return out


def _drain_one(done: zmq.Socket, router: zmq.Socket) -> bool:
    """Forward one reply from the policy thread to its client; False when none is waiting."""
    try:
        frames = done.recv_multipart(zmq.NOBLOCK)
    except zmq.Again:
        return False
    router.send_multipart(frames)
    return True
