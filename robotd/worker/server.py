"""The reference policy worker: serves one policy over ZeroMQ (docs/protocol.md).

Threads and sockets:
- The calling thread owns every socket and runs one poll loop: the ROUTER that clients'
  DEALERs talk to, and an inproc PAIR on which the policy thread hands back its replies.
  Requests are parsed and checked here, so a malformed one is answered at once even while
  the policy computes. (The observe connection of SPEC §4 will be one more socket in this
  poll loop.)
- One policy thread makes every call into the PolicyHost (episode bookkeeping, reset,
  infer, on_episode_end) in arrival order, one at a time, so an end_episode is ordered
  after the acts sent before it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from robotd import wire
from robotd.worker.policy_host import PolicyCallError, PolicyHost

log = logging.getLogger("robotd.worker")

PROTOCOL = 1
MAX_QUEUED = 64  # requests waiting for the policy thread; beyond that: error "busy"
MAX_STEPS = 65536
MAX_EPISODE_ID = 256
_POLL_MS = 100  # how often the loop looks at `stop`


class BadRequest(ValueError):
    """A request the worker refuses; `code` goes into the error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class _Job:
    """One request handed to the policy thread; `route` is the ROUTER envelope."""

    cmd: str
    route: list[bytes]
    rid: int
    episode: str
    step: int = 0
    steps: list[int] | None = None
    observations: list[dict[str, Any]] | None = None
    received: float = 0.0


def serve(
    policy: str,
    bind: str,
    *,
    policy_kwargs: dict[str, Any] | None = None,
    ready: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Load `policy` (MODULE:CLASS) and serve it on `bind` until `stop` is set.

    `ready(endpoint)` is called once the socket listens, with the bound endpoint (for
    tcp://host:0, the port actually chosen). Raises PolicyLoadError if the policy cannot be
    loaded, zmq.ZMQError if the endpoint cannot be bound. Without `stop`, serves until
    SIGTERM (handled when called from the main thread) or KeyboardInterrupt.
    """
    host = PolicyHost(policy, policy_kwargs)
    if stop is not None:
        _Server(host).run(bind, ready, stop)
        return
    stop = threading.Event()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set()) if in_main else None
    try:
        _Server(host).run(bind, ready, stop)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


class _Server:
    def __init__(self, host: PolicyHost) -> None:
        self.host = host
        self.jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=MAX_QUEUED)
        self.hello = {
            "protocol": PROTOCOL,
            "contract": {
                "observations": host.observations.to_wire() if host.observations else None,
                "actions": host.actions.to_wire() if host.actions else None,
            },
            "endpoints": {"observe": None},
            "policy": host.spec,
        }

    def run(self, bind: str, ready: Callable[[str], None] | None, stop: threading.Event) -> None:
        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
        done = ctx.socket(zmq.PAIR)
        done_addr = f"inproc://robotd-worker-done-{id(self)}"
        done.bind(done_addr)
        thread = threading.Thread(
            target=_PolicyLoop(self.host, ctx, done_addr, self.jobs).run,
            name="robotd-policy", daemon=True,
        )
        endpoint = None
        try:
            _prepare_ipc(bind)
            router.bind(bind)
            endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            thread.start()
            # stdout, not the log: the one line a supervisor or a user waits for.
            print(f"robotd worker: policy {self.host.spec} listening on {endpoint}", flush=True)
            if ready is not None:
                ready(endpoint)
            self._loop(router, done, stop, thread)
        finally:
            if thread.is_alive():
                _drop_queued(self.jobs)  # shutting down: unanswered requests time out
                self.jobs.put(None)
                thread.join(timeout=5.0)
            router.close(linger=0)
            if endpoint is not None:
                _remove_ipc(endpoint)
            done.close(linger=0)
            if thread.is_alive():  # a hung infer keeps its socket: don't wait on term()
                log.warning("policy thread still busy at shutdown; leaving it behind")
            else:
                ctx.term()

    def _loop(self, router: zmq.Socket, done: zmq.Socket, stop: threading.Event,
              thread: threading.Thread) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(done, zmq.POLLIN)
        while not stop.is_set():
            if not thread.is_alive():
                raise RuntimeError("the policy thread died; see the log above")
            ready = dict(poller.poll(_POLL_MS))
            if done in ready:
                while _drain_one(done, router):
                    pass
            if router in ready:
                while True:
                    try:
                        frames = router.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._handle(router, frames)

    def _handle(self, router: zmq.Socket, frames: list[bytes]) -> None:
        """Answer or queue one request; every failure becomes an error reply."""
        route, body = frames[:-1], frames[-1]
        if len(route) not in (1, 2) or (len(route) == 2 and route[1] != b""):
            _reply_error(router, frames[:1], None, "bad_request",
                         f"request must be one frame, got {len(frames) - 1}")
            return
        rid = None
        try:
            msg = wire.unpackb(body)
            rid = _request_id(msg)
            job = self._parse(msg, route, rid)
            if isinstance(job, _Job):
                self.jobs.put_nowait(job)
            else:  # answered without the policy (hello)
                _send(router, route, {"id": rid, "ok": True, "result": job})
        except BadRequest as err:
            _reply_error(router, route, rid, err.code, str(err))
        except wire.WireError as err:
            _reply_error(router, route, None, "bad_request", f"request is not msgpack: {err}")
        except queue.Full:
            _reply_error(router, route, rid, "busy",
                         f"{MAX_QUEUED} requests already wait for the policy")

    def _parse(self, msg: dict[str, Any], route: list[bytes], rid: int) -> _Job | dict[str, Any]:
        """A job for the policy thread, or the result of a request answered at once."""
        cmd = msg.get("cmd")
        if not isinstance(cmd, str):
            raise BadRequest("bad_request", f"field 'cmd': missing or not a string ({cmd!r})")
        if cmd == "hello":
            return self.hello
        if cmd == "end_episode":
            return _Job("end", route, rid, _episode_field(msg))
        if cmd == "act":
            step, steps, observations = _act_fields(msg, self.host.observations is not None)
            return _Job("act", route, rid, _episode_field(msg), step, steps, observations,
                        time.perf_counter())
        raise BadRequest("unknown_command",
                         f"field 'cmd': unknown command {cmd[:64]!r} (hello, act, end_episode)")


def _prepare_ipc(bind: str) -> None:
    """ipc endpoints: create the socket file's directory."""
    path = _ipc_path(bind)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)


def _remove_ipc(endpoint: str) -> None:
    """libzmq leaves a bound ipc socket file behind; remove ours (only if still a socket)."""
    path = _ipc_path(endpoint)
    if path is not None and path.is_socket():
        with contextlib.suppress(OSError):
            path.unlink()


def _ipc_path(endpoint: str) -> Path | None:
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if path and not path.startswith("@"):  # '@': Linux abstract namespace, no file
            return Path(path)
    return None


def _request_id(msg: Any) -> int:
    if not isinstance(msg, dict):
        raise BadRequest("bad_request", f"request must be a map, got {type(msg).__name__}")
    rid = msg.get("id")
    if not _is_int(rid):
        raise BadRequest("bad_request", f"field 'id': missing or not an integer ({rid!r})")
    return rid


def _episode_field(msg: dict[str, Any]) -> str:
    episode = msg.get("episode")
    if not isinstance(episode, str) or not 0 < len(episode) <= MAX_EPISODE_ID:
        raise BadRequest("bad_request", "field 'episode': missing or not a string of "
                         f"1..{MAX_EPISODE_ID} characters ({str(episode)[:64]!r})")
    return episode


def _act_fields(msg: dict[str, Any], windowed: bool) -> tuple[int, list[int], list[dict]]:
    step, steps, observations = msg.get("step"), msg.get("steps"), msg.get("observations")
    if not _is_int(step) or step < 0:
        raise BadRequest("bad_request", f"field 'step': missing or not an integer >= 0 ({step!r})")
    if not isinstance(steps, list) or not 0 < len(steps) <= MAX_STEPS:
        raise BadRequest("bad_request", f"field 'steps': missing or not a list of 1..{MAX_STEPS} "
                         "step numbers")
    for i, s in enumerate(steps):
        if not _is_int(s):
            raise BadRequest("bad_request", f"field 'steps[{i}]': not an integer ({s!r})")
        if i and s <= steps[i - 1]:
            raise BadRequest("bad_request", f"field 'steps[{i}]': {s} after {steps[i - 1]} "
                             "(steps must be strictly ascending)")
    if steps[-1] != step:
        raise BadRequest("bad_request", f"field 'steps': last entry {steps[-1]} is not the "
                         f"act's own step {step}")
    if not windowed and len(steps) != 1:
        raise BadRequest("bad_request", f"field 'steps': {len(steps)} steps, but the policy "
                         "declares no observation contract (the act carries its own step only)")
    if not isinstance(observations, list) or len(observations) != len(steps):
        got = len(observations) if isinstance(observations, list) else type(observations).__name__
        raise BadRequest("bad_request", f"field 'observations': need a list of {len(steps)} "
                         f"maps (one per entry of steps), got {got}")
    for i, obs in enumerate(observations):
        if not isinstance(obs, dict):
            raise BadRequest("bad_request", f"field 'observations[{i}]': not a map "
                             f"({type(obs).__name__})")
    return step, steps, observations


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _send(sock: zmq.Socket, route: list[bytes], reply: dict[str, Any]) -> None:
    sock.send_multipart([*route, wire.packb(reply)])


def _reply_error(sock: zmq.Socket, route: list[bytes], rid: int | None, code: str,
                 message: str) -> None:
    log.debug("error reply %s: %s", code, message)
    _send(sock, route, {"id": rid, "ok": False, "error": {"code": code, "message": message}})


def _drop_queued(jobs: queue.Queue[_Job | None]) -> None:
    while True:
        try:
            jobs.get_nowait()
        except queue.Empty:
            return


def _drain_one(done: zmq.Socket, router: zmq.Socket) -> bool:
    """Forward one reply from the policy thread to its client; False when none is waiting."""
    try:
        frames = done.recv_multipart(zmq.NOBLOCK)
    except zmq.Again:
        return False
    router.send_multipart(frames)
    return True


class _PolicyLoop:
    """The policy thread: runs jobs in order and sends each reply to the poll loop."""

    def __init__(self, host: PolicyHost, ctx: zmq.Context, done_addr: str,
                 jobs: queue.Queue[_Job | None]) -> None:
        self.host = host
        self.ctx = ctx
        self.done_addr = done_addr
        self.jobs = jobs

    def run(self) -> None:
        out = self.ctx.socket(zmq.PAIR)
        out.connect(self.done_addr)
        try:
            while (job := self.jobs.get()) is not None:
                try:
                    reply = {"id": job.rid, "ok": True, "result": self._run(job)}
                except PolicyCallError as err:
                    reply = _error(job.rid, err.code, str(err))
                except Exception as err:  # never let one request stop the worker
                    log.exception("internal error on %s", job.cmd)
                    reply = _error(job.rid, "internal", f"{type(err).__name__}: {err}")
                try:
                    _send(out, job.route, reply)
                except wire.WireError as err:
                    _send(out, job.route, _error(job.rid, "internal", str(err)))
        finally:
            out.close(linger=0)

    def _run(self, job: _Job) -> dict[str, Any]:
        if job.cmd == "end":
            self.host.end_episode(job.episode)
            return {}
        assert job.steps is not None and job.observations is not None
        self.host.begin(job.episode)
        inputs = self.host.inputs(job.steps, job.observations)
        start = time.perf_counter()
        rows = self.host.infer(inputs, job.episode)
        done = time.perf_counter()
        return {
            "actions": rows,
            "timing": {"infer_ms": (done - start) * 1e3, "queue_ms": (start - job.received) * 1e3},
            "step": job.step,
            "episode": job.episode,
        }


def _error(rid: int | None, code: str, message: str) -> dict[str, Any]:
    return {"id": rid, "ok": False, "error": {"code": code, "message": message}}
