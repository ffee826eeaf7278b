"""The operator control socket (ROUTER) and the telemetry PUB socket.

Requests are one msgpack frame ``{id, cmd, args}``; replies ``{id, ok, result}`` or
``{id, ok: false, error: {code, message}}``. Every request is validated before anything
acts on it (robotd.operator.requests): a malformed one gets an error reply and changes
nothing, and the control lane is sent only the small command it needs. The default
endpoints are ipc:// in the run directory, mode 0660; over tcp both sockets are CURVE
servers that answer only the authorised clients (robotd.operator.curve). Where the
sockets are is robotd.operator.endpoints'; what a request other than a lane command is
answered is robotd.operator.answers'; this module is the sockets, the dispatch and the
replies.
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
from robotd.operator import answers
from robotd.operator.curve import set_curve_server, start_authenticator
from robotd.operator.endpoints import endpoints, ipc_path, server_keys
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
from robotd.runtime.view import DaemonView, LaneCommands, OperatorPolicy, status_dict

log = logging.getLogger("robotd.operator")

# A frame over this is not even taken in: ZeroMQ drops the peer (requests are far smaller).
MAX_FRAME_BYTES = 1 << 20

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
        policy: OperatorPolicy | None = None,
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
            path = ipc_path(ep)
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
            path = ipc_path(self.control_ep)
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
            result: Any = answers.local(self.view, req)
        except RequestError as exc:
            result = exc
        self._told(req, result)
        await self._reply(envelope, req.rid, result)

    async def _answer_params(self, envelope: list[bytes], req: Request) -> None:
        try:
            result: Any = await answers.params(self.cfg, self.policy, req.args)
        except RequestError as exc:
            result = exc
        except TimeoutError as exc:
            result = RequestError("timeout", f"the policy worker did not answer: {exc}")
        self._told(req, result)
        await self._reply(envelope, req.rid, result)

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
        """Forward a validated lane command (only its bounded arguments) and await the reply.
        A start is refused here while the policy cannot answer its first act (an openpi
        server's warm-up): the episode would hold until the warm-up ends, or end `starved`,
        and its robot would move up to minutes after its operator asked."""
        log.info("operator: %s %s", req.cmd, summary(req.args))
        why = self.policy.not_ready() if req.cmd == "start" and self.policy is not None else ""
        if why:
            raise RequestError(
                "policy_not_ready",
                f"start refused: {why}, and acts wait for it; start again once "
                "`robotctl status` says it answered",
            )
        reply = await self.lane.command(
            req.cmd, **lane_args(req), sent_ns=req.sent_ns, expires_ns=expires_ns(req)
        )
        if not reply.ok:
            raise RequestError(reply.code or "refused", reply.message or "refused")
        out = status_dict(reply.status)  # the state the command left, not a later one
        if reply.written_ns is not None:  # an e-stop: when its safe command was written
            out["written_ns"] = reply.written_ns
        return out

    async def _telemetry(self) -> None:
        period = 1.0 / self.cfg.runtime.telemetry_hz
        try:
            while True:
                await anyio.sleep(period)
                msg = wire.packb(answers.telemetry_message(self.view))
                with contextlib.suppress(zmq.Again):  # no subscriber keeping up: skip this one
                    await self.pub.send_multipart([b"status", msg], zmq.NOBLOCK)
        finally:
            self.pub.close(linger=0)
            path = ipc_path(self.telemetry_ep)
            if path is not None:
                remove_socket_file(path)

