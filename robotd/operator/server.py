"""The operator control socket (ROUTER) and the telemetry PUB socket.

Requests are one msgpack frame ``{id, cmd, args}``; replies ``{id, ok, result}`` or
``{id, ok: false, error: {code, message}}``. Every request is validated before anything
acts on it (robotd.operator.requests): a malformed one gets an error reply and changes
nothing, and the control lane is sent only the small command it needs. The default
endpoints are ipc:// in the run directory, mode 0660; over tcp both sockets are CURVE
servers that answer only the authorised clients (robotd.operator.curve).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import zmq
import zmq.asyncio

from robotd import wire
from robotd.config import Config
from robotd.errors import ConfigError
from robotd.operator.curve import (
    KeyFileError,
    ServerKeys,
    load_server_keys,
    set_curve_server,
    start_authenticator,
)
from robotd.operator.requests import (
    LANE_COMMANDS,
    LOCAL_COMMANDS,
    Request,
    RequestError,
    expires_ns,
    lane_args,
    parse_request,
    split_request,
    summary,
)
from robotd.operator.words import printable
from robotd.runtime.bridge import LaneBusy
from robotd.runtime.rundir import remove_socket_file
from robotd.runtime.view import DaemonView, LaneCommands, PolicyParams, status_dict

__all__ = [
    "LANE_COMMANDS",
    "LOCAL_COMMANDS",
    "OperatorServer",
    "RequestError",
    "check_operator",
    "endpoints",
    "parse_request",
]

log = logging.getLogger("robotd.operator")

# The control lane's counters that telemetry carries (the summary has them all).
TELEMETRY_COUNTERS = (
    "ticks",
    "missed_ticks",
    "acts",
    "chunks",
    "holds",
    "max_consecutive_holds",
    "starved_episodes",
    "stale_chunks",
    "rows_dropped",
    "stale_rows_played",
    "delay_overruns",
    "episode_resets",
    "interventions",
    "clipped",
    "clamped",
    "rejected",
    "invalid_observations",
)
# A frame over this is not even taken in: ZeroMQ drops the peer (requests are far smaller).
MAX_FRAME_BYTES = 1 << 20


def endpoints(cfg: Config, run_dir: Path) -> tuple[str, str]:
    """The control and telemetry endpoints: the config's, else ipc:// in the run directory."""
    control = cfg.runtime.control_endpoint or f"ipc://{run_dir}/control.sock"
    telemetry = cfg.runtime.telemetry_endpoint or f"ipc://{run_dir}/telemetry.sock"
    for ep, key in ((control, "control_endpoint"), (telemetry, "telemetry_endpoint")):
        if not ep.startswith(("ipc://", "tcp://")):
            raise ValueError(f"runtime.{key}: {ep!r}: only ipc:// and tcp:// are served")
    return control, telemetry


def _uses_tcp(cfg: Config) -> bool:
    r = cfg.runtime
    return any(ep.startswith("tcp://") for ep in (r.control_endpoint, r.telemetry_endpoint))


def server_keys(cfg: Config) -> ServerKeys | None:
    """The CURVE keys when an operator endpoint is tcp (KeyFileError when unusable)."""
    if not _uses_tcp(cfg):
        return None
    r = cfg.runtime
    if not (r.curve_secret_key and r.curve_clients):
        raise KeyFileError(
            "a tcp operator endpoint needs runtime.curve_secret_key and curve_clients"
        )
    return load_server_keys(r.curve_secret_key, r.curve_clients)


def check_operator(cfg: Config, where: str = "") -> None:
    """What `robotd check` and `robotd run` ask before anything moves: tcp endpoints have
    usable CURVE keys. Raises ConfigError naming the key and the file."""
    try:
        server_keys(cfg)
    except KeyFileError as exc:
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}runtime.curve_secret_key/curve_clients: {exc}") from None


def _ipc_path(ep: str) -> Path | None:
    return Path(ep.removeprefix("ipc://")) if ep.startswith("ipc://") else None


# Told every answered request: (cmd, validated args, error or None, result) — the trace.
OnCommand = Callable[[str, Mapping[str, Any], "str | None", Any], None]


class OperatorServer:
    """Serves operator requests: reads through the daemon's view, commands the lane.
    `on_command` hears each request as answered (it must return at once)."""

    def __init__(
        self,
        view: DaemonView,
        lane: LaneCommands,
        cfg: Config,
        run_dir: Path,
        ctx: zmq.asyncio.Context,
        policy: PolicyParams | None = None,
        on_command: OnCommand | None = None,
    ) -> None:
        self.on_command = on_command
        self.view = view
        self.lane = lane
        self.policy = policy
        self.ctx = ctx
        self.cfg = cfg
        self.control_ep, self.telemetry_ep = endpoints(cfg, run_dir)
        self._local = self.control_ep.startswith("ipc://")  # clients share our clock
        self.keys = server_keys(cfg)  # checked before start-up too (check_operator)
        self.auth: Any = None
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 100)
        for sock, ep in ((self.sock, self.control_ep), (self.pub, self.telemetry_ep)):
            if ep.startswith("tcp://"):
                assert self.keys is not None
                set_curve_server(sock, self.keys)

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        if self.keys is not None:
            self.auth = start_authenticator(self.ctx, self.keys)  # before any handshake
        for sock, ep in ((self.sock, self.control_ep), (self.pub, self.telemetry_ep)):
            path = _ipc_path(ep)
            if path is not None:
                path.unlink(missing_ok=True)
            sock.bind(ep)
            if path is not None:
                os.chmod(path, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IWGRP)
        tg.start_soon(self._serve, tg)
        tg.start_soon(self._telemetry)
        curve = " (CURVE)" if self.keys is not None else ""
        log.info("operator socket %s, telemetry %s%s", self.control_ep, self.telemetry_ep, curve)

    async def _serve(self, tg: anyio.abc.TaskGroup) -> None:
        try:
            while True:
                # A queued request is received without a wait: without this yield a client
                # that floods requests would hold the loop, and with it the up stream, the
                # policy link and the watchdog, for as long as its queue lasts.
                await anyio.lowlevel.checkpoint()
                frames = await self.sock.recv_multipart()
                envelope, payload = split_request(frames)
                if payload is None:
                    err = RequestError("bad_request", "a request is one msgpack frame")
                    await self._reply(envelope, None, err)
                    continue
                try:
                    req = self._stamped(parse_request(payload))
                except RequestError as exc:
                    await self._reply(envelope, exc.rid, exc)
                    continue
                if req.cmd == "params":  # the worker may be asked: never wait in this loop
                    tg.start_soon(self._answer_params, envelope, req)
                elif req.cmd in LOCAL_COMMANDS:
                    await self._answer(envelope, req)
                else:  # bounded by the bridge: LaneBusy beyond its pending limit
                    tg.start_soon(self._answer_lane, envelope, req)
        finally:
            self.sock.close(linger=0)
            if self.auth is not None:
                self.auth.stop()
            path = _ipc_path(self.control_ep)
            if path is not None:
                remove_socket_file(path)

    async def _reply(self, envelope: list[bytes], rid: Any, result: Any) -> None:
        if isinstance(result, RequestError):
            err = {"code": result.code, "message": str(result)}
            reply = {"id": rid, "ok": False, "error": err}
        else:
            reply = {"id": rid, "ok": True, "result": result}
        with contextlib.suppress(zmq.ZMQError):  # the client went away
            await self.sock.send_multipart([*envelope, wire.packb(reply)])

    async def _answer(self, envelope: list[bytes], req: Request) -> None:
        try:
            result: Any = self.handle_local(req)
        except RequestError as exc:
            result = exc
        self._told(req, result)
        await self._reply(envelope, req.rid, result)

    async def _answer_params(self, envelope: list[bytes], req: Request) -> None:
        try:
            result: Any = await self.handle_params(req.args)
        except RequestError as exc:
            result = exc
        except TimeoutError as exc:
            result = RequestError("timeout", f"the policy worker did not answer: {exc}")
        self._told(req, result)
        await self._reply(envelope, req.rid, result)

    async def handle_params(self, args: dict[str, Any]) -> Any:
        """Without `set`: the config in force and the policy's inference parameters. With
        `set`: the policy's parameters changed, from its next episode on (never mid-episode;
        the worker checks each against its declared type)."""
        from robotd.link.client import PolicyError

        changes = args.get("set")
        if not changes:
            out: dict[str, Any] = {"config": self.cfg.model_dump(mode="json")}
            if self.policy is not None:
                try:
                    out["policy"] = (await self.policy.params(None)).get("params", [])
                except PolicyError as exc:
                    out["policy"] = f"{exc.code}: {exc.message}"
            return out
        if self.policy is None:
            raise RequestError("not_supported", "params: no policy link to set parameters on")
        try:
            result = await self.policy.params(changes)
        except PolicyError as exc:
            raise RequestError(exc.code, f"params: {exc.message}") from None
        log.info("operator: params set %s (from the next episode on)", summary(changes))
        return result

    def _told(self, req: Request, result: Any) -> None:
        failed = isinstance(result, RequestError)
        error = f"{result.code}: {result}" if failed else None
        if failed and req.cmd in LANE_COMMANDS:  # the log says what did not happen, too
            log.warning("operator: %s failed: %s", req.cmd, printable(error)[:300])
        if self.on_command is None:
            return
        try:
            self.on_command(req.cmd, req.args, error, None if failed else result)
        except Exception:  # the trace must never cost an operator their answer
            log.exception("recording the operator command %s", req.cmd)

    async def _answer_lane(self, envelope: list[bytes], req: Request) -> None:
        try:
            result: Any = await self.handle_lane(req)
        except RequestError as exc:
            result = exc
        except TimeoutError as exc:
            result = RequestError("timeout", str(exc))
        except LaneBusy as exc:
            result = RequestError("busy", str(exc))
        self._told(req, result)
        await self._reply(envelope, req.rid, result)

    def _stamped(self, req: Request) -> Request:
        """`req` with the time it was taken: now, or a local client's own earlier send time
        (the same system-wide clock over ipc; a remote client's clock is another machine's).
        A request that waited unread while this process was stopped is then still ordered
        before an e-stop sent meanwhile straight to the lane."""
        taken = time.monotonic_ns()
        sent = req.sent_ns if self._local and req.sent_ns else taken
        return dataclasses.replace(req, sent_ns=min(sent, taken))

    async def handle_lane(self, req: Request) -> Any:
        """Forward a validated lane command (only its bounded arguments) and await the reply."""
        log.info("operator: %s %s", req.cmd, summary(req.args))
        reply = await self.lane.command(
            req.cmd, **lane_args(req), sent_ns=req.sent_ns, expires_ns=expires_ns(req)
        )
        if not reply.ok:
            raise RequestError(reply.code or "refused", reply.message or "refused")
        out = status_dict(reply.status)  # the state the command left, not a later one
        if reply.written_ns is not None:  # an e-stop: when its safe command was written
            out["written_ns"] = reply.written_ns
        return out

    def handle_local(self, req: Request) -> Any:
        v = self.view
        if req.cmd == "status":
            out = {**v.state(), "run_id": v.run_id, "robot": v.robot, "link": v.link()}
            if (trace := v.trace()) is not None:
                out["trace"] = trace
            return out
        if req.cmd == "stats":  # the lane's age first: its numbers may be its last
            return {**v.lane(), **v.summary.to_dict()}
        if req.cmd == "verdict":
            return self._verdict(req.args)
        raise RequestError("unknown_command", req.cmd)  # unreachable: parse_request checked

    def _verdict(self, args: dict[str, Any]) -> dict[str, Any]:
        episode = self.view.state().get("episode", 0)
        if not isinstance(episode, int) or episode <= 0:
            raise RequestError("bad_state", "no episode has started yet: nothing to judge")
        verdicts = self.view.summary.verdicts
        index = next((i for i, v in enumerate(verdicts) if v.get("episode") == episode), None)
        if index is not None and not args.get("replace", False):
            first = verdicts[index]
            said = "success" if first.get("success") else "failure"
            when = time.strftime("%H:%M:%S", time.localtime(first.get("time", 0)))
            notes = f" ({summary({'notes': first['notes']})})" if first.get("notes") else ""
            raise RequestError(
                "verdict_exists",
                f"episode {episode} already has a verdict: {said}{notes}, given at {when}; "
                "send it with replace (robotctl verdict --replace) to replace it",
            )
        verdict = {
            "episode": episode,
            "success": args["success"],
            "notes": args.get("notes", ""),
            "time": time.time(),
        }
        if index is None:
            verdicts.append(verdict)
        else:
            verdicts[index] = verdict
        word = "replaced: " if index is not None else ""
        log.info(
            "verdict %sepisode %d %s %s",
            word,
            episode,
            "success" if verdict["success"] else "failure",
            summary({"notes": verdict["notes"]}) if verdict["notes"] else "",
        )
        return verdict

    def telemetry_message(self) -> dict[str, Any]:
        """What one telemetry message carries (the view tolerates any field missing)."""
        s = self.view.summary
        return {
            "time": time.time(),
            "run_id": self.view.run_id,
            "state": self.view.state(),
            "link": self.view.link(),
            "hz": s.measured_hz(),
            "lateness_us": s.lateness(),
            "counters": {
                **{k: s.count(k) for k in TELEMETRY_COUNTERS},
                **s.uploads(),
                **s.link_counts(),
            },
            "ask_latency": s.ask_latency(),
            "act_rtt_ms": s.act_rtt_ms(),
            "infer_ms": s.infer_ms(),
            "robot": self.view.robot_state(),
        }

    async def _telemetry(self) -> None:
        period = 1.0 / self.cfg.runtime.telemetry_hz
        try:
            while True:
                await anyio.sleep(period)
                msg = wire.packb(self.telemetry_message())
                with contextlib.suppress(zmq.Again):  # no subscriber keeping up: skip this one
                    await self.pub.send_multipart([b"status", msg], zmq.NOBLOCK)
        finally:
            self.pub.close(linger=0)
            path = _ipc_path(self.telemetry_ep)
            if path is not None:
                remove_socket_file(path)

