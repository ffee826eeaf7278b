"""The reference policy worker: serves one policy over ZeroMQ (docs/protocol.md).

Processes, threads and sockets:
- The policy runs in copies (robotd.worker.pool): each its own child process, or with
  `copies=0` one thread of the worker. The worker's main process never builds the policy:
  it learns the contract from the first copy that is ready.
- The calling thread owns every socket and runs one poll loop: the act ROUTER that clients'
  DEALERs talk to, the observe ROUTER that daemons upload observations to (ahead of their acts), the
  preparer's inproc PAIR, each copy's channel (robotd.worker.channel: a Unix socket pair) and
  each copy process's pidfd (readable the moment it ends). Requests are parsed and checked
  here, and pings answered, whatever the copies are doing.
- Uploads go into the frame store (robotd.worker.store), decoded ahead on a decoder thread;
  an act naming steps not yet uploaded is parked until they come or its wait is over
  (robotd.worker.act_requests).
- A preparer thread decodes what was not done ahead and packs each act for its copy.
"""

from __future__ import annotations

import gc
import logging
import secrets
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from robotd import framed, wire
from robotd.contract import Actions, Observations
from robotd.runtime.procutil import signal_event
from robotd.stream.endpoint import is_stream, zmq_equivalent
from robotd.stream.router import StreamRouter
from robotd.worker.act_requests import ActRequests
from robotd.worker.decoding import Decoder
from robotd.worker.frame import DecodeBudget
from robotd.worker.health import health
from robotd.worker.params import params_to_wire
from robotd.worker.policy_load import PolicyLoadError
from robotd.worker.pool import Pool
from robotd.worker.preparer import OK, Preparer
from robotd.worker.requests import (
    BadRequest,
    check_bind_endpoint,
    observe_endpoint,
    prepare_ipc,
    remove_ipc,
    request_id,
    upload_fields,
)
from robotd.worker.slots import CopyOptions
from robotd.worker.store import FrameStore, StoreLimits
from robotd.worker.watch import Watch

log = logging.getLogger("robotd.worker")

PROTOCOL = 2  # the newest this worker speaks; 1 (every message one frame) too
FEATURES = ["ping", "params", "episode_lost"]
_POLL_MS = 100  # how often the loop looks at `stop`

__all__ = ["CopyOptions", "observe_endpoint", "serve"]


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
    copies: CopyOptions | None = None,
) -> None:
    """Load `policy` (MODULE:CLASS) and serve it on `bind` until `stop` is set.

    `copies` says how the policy runs (default CopyOptions(copies=0): one copy in a thread
    of this process, as `serve` always did; `robotd serve` runs one child process by
    default). The observe socket binds `observe`, by default derived from `bind` (see
    `observe_endpoint`). `ready(endpoint)` is called once both listen, with the act endpoint
    bound (for tcp://host:0, the port actually chosen). `limits` bound the frame store;
    `stream_wait_s` is how long an act waits for its steps unless it says otherwise. Raises
    PolicyLoadError if the policy cannot be loaded, ValueError before anything starts if
    an endpoint's scheme or shape is wrong (check_bind_endpoint), zmq.ZMQError if an
    endpoint cannot be bound. Without `stop`, serves until SIGTERM (handled when called
    from the main thread) or KeyboardInterrupt.
    """
    # Before anything starts (the copies load the policy): a bad endpoint is said at once.
    check_bind_endpoint(bind, "--bind", stream=True)
    if observe:
        check_bind_endpoint(observe, "--observe", stream=False)
    observe = observe or observe_endpoint(bind)
    server = _Server(
        policy, dict(policy_kwargs or {}), limits or StoreLimits(), stream_wait_s, copies
    )
    if stop is not None:
        server.run(bind, observe, ready, stop)
        return
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    # Not a handler that sets the event itself: a SIGTERM arriving while the loop is inside
    # stop.set() or stop.is_set() (the event's lock held) would deadlock the worker for good
    # (a local worker whose daemon was SIGKILLed got PDEATHSIG's SIGTERM and then the
    # process group's, and outlived it). A pipe and a thread set it (procutil.signal_event).
    stop = signal_event((signal.SIGTERM,)) if in_main else threading.Event()
    try:
        server.run(bind, observe, ready, stop)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


class _Server:
    def __init__(
        self,
        spec: str,
        kwargs: dict[str, Any],
        limits: StoreLimits,
        stream_wait_s: float,
        copies: CopyOptions | None,
    ) -> None:
        self.spec, self.kwargs, self.limits = spec, kwargs, limits
        self.stream_wait_s = stream_wait_s
        self.options = copies or CopyOptions(copies=0)
        self.started = time.monotonic()
        # Who answers: a new process says a new instance, so a daemon whose connection
        # came back within its heartbeat still learns the worker restarted (hello again).
        self.instance = secrets.token_hex(8)
        self.observe_ep: str | None = None
        self.hello_result: dict[str, Any] = {}

    def run(
        self, bind: str, observe: str, ready: Callable[[str], None] | None, stop: threading.Event
    ) -> None:
        ctx = zmq.Context()
        sockets: list[zmq.Socket] = []
        bound: list[str] = []
        streams: list[StreamRouter] = []
        pool: Pool | None = None
        helpers: list[Any] = []
        try:
            pool = Pool(self.spec, self.kwargs, self.options, self._reply)
            pool.copies.start()
            if not _await_first_copy(pool, stop):
                return
            store, decoder, preparer, prep_sock = self._build(ctx, pool, sockets)
            helpers += [decoder, preparer]
            router = _act_socket(ctx, bind, sockets, streams)
            obs = _socket(ctx, zmq.ROUTER, sockets)
            for sock, ep in ((router, bind), (obs, observe)):
                prepare_ipc(zmq_equivalent(ep))
                if isinstance(sock, StreamRouter):
                    bound.append(sock.bind())
                else:
                    sock.bind(ep)
                    bound.append(sock.getsockopt_string(zmq.LAST_ENDPOINT))
            self.observe_ep = bound[1]
            windowed = self.hello_result["contract"]["observations"] is not None
            self.acts = ActRequests(
                router, pool, store, windowed, self.stream_wait_s, self._hello, self._health
            )
            # stdout, not the log: the one line a supervisor or a user waits for.
            print(
                f"robotd worker: policy {self.spec} listening on {bound[0]} (observe {bound[1]})",
                flush=True,
            )
            if ready is not None:
                ready(bound[0])
            gc.freeze()  # what was built is kept: the collector scans only what acts make
            self._loop(pool, store, obs, prep_sock, stop)
        finally:
            for helper in helpers:
                helper.stop()
            if pool is not None:
                pool.copies.stop()
            for sock in sockets:
                sock.close(linger=0)
            for stream in streams:
                stream.close()
            for ep in bound:
                remove_ipc(ep)
            if pool is not None and pool.copies.threads_left():
                log.warning("a copy's thread is still busy at shutdown; leaving it behind")
            ctx.term()

    def _build(
        self, ctx: zmq.Context, pool: Pool, sockets: list[zmq.Socket]
    ) -> tuple[FrameStore, Decoder, Preparer, zmq.Socket]:
        """What needs the policy's contract: the store, the decoder, the preparer, hello."""
        first = pool.copies.ready_message or {}
        contract = first.get("contract") or {}
        observations = contract.get("observations")
        obs = Observations.from_wire(observations) if observations is not None else None
        actions = contract.get("actions")
        act = Actions.from_wire(actions) if actions is not None else None
        streams = obs.streams if obs is not None else {}
        layouts = {k: s.camera.layout for k, s in streams.items() if s.camera is not None}
        decoder = Decoder(layouts, DecodeBudget(self.limits.decoded_bytes))
        store = FrameStore(
            self.limits, keys=streams if obs is not None else None, on_frame=decoder.submit
        )
        prep_sock = _socket(ctx, zmq.PAIR, sockets)
        prep_addr = f"inproc://robotd-prepare-{id(self)}"
        prep_sock.bind(prep_addr)
        preparer = Preparer(ctx, prep_addr, layouts)
        pool.prepare, pool.pack_now = preparer.submit, preparer.pack_now
        pool.decode_now = preparer.decode_now
        decoder.start()
        preparer.start()
        self.hello_result = {
            "protocol": PROTOCOL,
            "contract": {
                "observations": obs.to_wire() if obs is not None else None,
                "actions": act.to_wire() if act is not None else None,
            },
            "endpoints": {"observe": None},
            "limits": self.limits.to_wire(),
            "policy": self.spec,
            "instance": self.instance,
            "features": FEATURES,
            "copies": {
                "count": self.options.copies,
                "isolated": self.options.copies > 0,
                "inline": self.options.inline,
                "hang_s": self.options.hang_s,
                "first_call_s": self.options.first_call_s,
            },
        }
        self.pool = pool
        return store, decoder, preparer, prep_sock

    def _hello(self, observe: bool, protocol: int) -> dict[str, Any]:
        """hello's result; `protocol` the newest the client speaks (1 if it did not say):
        the answer names the newest both speak."""
        params = params_to_wire(self.pool.copies.declared, self.pool.params_next)
        endpoints = {"observe": self.observe_ep if observe else None}
        spoken = max(1, min(PROTOCOL, protocol))
        return {**self.hello_result, "protocol": spoken, "endpoints": endpoints, "params": params}

    def _health(self, episode: str | None) -> dict[str, Any]:
        return health(self.pool, self.acts, self.started, self.instance, episode)

    def _reply(self, route: list[bytes], reply: dict[str, Any]) -> None:
        self.acts.send(route, reply)

    def _loop(
        self,
        pool: Pool,
        store: FrameStore,
        obs: zmq.Socket,
        prep: zmq.Socket,
        stop: threading.Event,
    ) -> None:
        router = self.acts.router
        stream = router if isinstance(router, StreamRouter) else None
        watch = Watch(pool, [obs, prep] if stream else [router, obs, prep], stream)
        copies = pool.copies
        while not stop.is_set():
            until_check = max(0.0, copies.due - time.monotonic())
            wait_ms = min(self.acts.poll_ms(_POLL_MS), int(until_check * 1e3) + 1)
            ready = watch.poll(wait_ms)
            watch.copies(ready)  # their messages before their exits: last words explain an end
            if prep in ready:
                for frames in _recv_all(prep, copy=False):
                    identity, seq, tag = (f.bytes for f in frames[:3])
                    pool.prepared(identity, int.from_bytes(seq, "little"), tag == OK, frames[3:])
            now = time.monotonic()
            if now >= copies.due or watch.exits(ready):  # a deadline, or a copy ended
                copies.check(now)
            if obs in ready:
                touched = {_handle_observe(store, obs, frames) for frames in _recv_all(obs)}
                for episode in touched - {None}:
                    self.acts.recheck(episode)
            if stream is not None:
                for frames in stream.receive(ready):
                    self.acts.handle(frames)
            elif router in ready:  # frames not copied: arrays are views of them, passed on
                for frames in _recv_all(router, copy=False):
                    self.acts.handle(frames)
            self.acts.expire()


def _socket(ctx: zmq.Context, kind: int, sockets: list[zmq.Socket]) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
        sock.copy_threshold = framed.COPY_BELOW  # sent with copy=False: see there
    sockets.append(sock)
    return sock


def _act_socket(
    ctx: zmq.Context, bind: str, sockets: list[zmq.Socket], streams: list[StreamRouter]
) -> zmq.Socket | StreamRouter:
    """The act endpoint: a ZeroMQ ROUTER, or for stream+tcp:// / stream+ipc:// a
    StreamRouter (robotd.stream.router: the same requests, a lighter transport)."""
    if not is_stream(bind):
        return _socket(ctx, zmq.ROUTER, sockets)
    stream = StreamRouter(bind, max_message_bytes=wire.MAX_MESSAGE_BYTES)
    streams.append(stream)
    return stream


def _await_first_copy(pool: Pool, stop: threading.Event) -> bool:
    """Wait until a copy is ready (True), `stop` is set (False), or the first copy failed
    to start (PolicyLoadError with its reason)."""
    watch = Watch(pool, [])
    while not stop.is_set():
        if pool.copies.fatal is not None:
            raise PolicyLoadError(pool.copies.fatal)
        if pool.copies.ready_message is not None:
            return True
        watch.copies(watch.poll(_POLL_MS))
        pool.copies.check(time.monotonic())
    return False


def _handle_observe(store: FrameStore, sock: zmq.Socket, frames: list[bytes]) -> str | None:
    """Keep one upload (post) or skip declaration and acknowledge it; returns the episode
    it touched (its parked acts are looked at again)."""
    route, body = frames[:-1], frames[-1]
    rid = None
    if len(route) != 1:
        text = f"upload must be one frame, got {len(frames) - 1}"
        _send(sock, frames[:1], {"id": None, "ok": False, "error": _err("bad_request", text)})
        return None
    try:
        msg = wire.unpackb(body)
        rid = request_id(msg)
        up = upload_fields(msg)
    except BadRequest as err:
        _send(sock, route, {"id": rid, "ok": False, "error": _err(err.code, str(err))})
        return None
    except wire.WireError as err:
        text = f"upload is not msgpack: {err}"
        _send(sock, route, {"id": None, "ok": False, "error": _err("bad_request", text)})
        return None
    result: dict[str, Any] = {"episode": up.episode, "step": up.step, "refused": None}
    if up.cmd == "post":
        through, refusal = store.post(route[0], up.episode, up.step, up.values, len(body))
    else:
        through, refusal = store.skip(route[0], up.episode, up.step, up.keys, up.reason)
    if refusal is not None:
        log.warning("upload refused: %s", refusal.message)
        result["refused"] = {"code": refusal.code, "message": refusal.message}
    result["through"] = through
    _send(sock, route, {"id": rid, "ok": True, "result": result})
    return up.episode


def _err(code: str, message: str) -> dict[str, str]:
    log.debug("error reply %s: %s", code, message)
    return {"code": code, "message": message}


def _send(sock: zmq.Socket, route: list[bytes], reply: dict[str, Any]) -> None:
    sock.send_multipart([*route, wire.packb(reply)])


def _recv_all(sock: zmq.Socket, copy: bool = True) -> list[list[Any]]:
    """Every message waiting on `sock`, without blocking."""
    out = []
    while True:
        try:
            out.append(sock.recv_multipart(zmq.NOBLOCK, copy=copy))
        except zmq.Again:
            return out
