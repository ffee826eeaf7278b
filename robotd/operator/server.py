"""The operator control socket (ROUTER) and the telemetry PUB socket.

Requests are one msgpack frame ``{id, cmd, args}``; replies ``{id, ok, result}`` or
``{id, ok: false, error: {code, message}}``. Any malformed request gets an error
reply and changes nothing. The default endpoint is ipc:// in the run directory
with 0660 permissions; tcp is refused (it needs CURVE keys, not yet configurable).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

import anyio
import zmq
import zmq.asyncio

from robotd import wire
from robotd.config import Config
from robotd.runtime.bridge import LaneBusy
from robotd.runtime.view import DaemonView, LaneCommands, status_dict

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
    "episode_resets",
    "interventions",
    "invalid_observations",
)
LANE_COMMANDS = {"start", "stop", "estop", "clear_fault", "reset_done"}
LOCAL_COMMANDS = {"status", "stats", "params", "verdict"}


class RequestError(Exception):
    def __init__(self, code: str, message: str, rid: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.rid = rid  # the request's id when it could be read: a client matches replies by it


def endpoints(cfg: Config, run_dir: Path) -> tuple[str, str]:
    control = cfg.runtime.control_endpoint or f"ipc://{run_dir}/control.sock"
    telemetry = cfg.runtime.telemetry_endpoint or f"ipc://{run_dir}/telemetry.sock"
    for ep, key in ((control, "control_endpoint"), (telemetry, "telemetry_endpoint")):
        if not ep.startswith("ipc://"):
            raise ValueError(
                f"runtime.{key}: {ep!r}: only ipc:// endpoints are served "
                "(tcp needs CURVE keys, which this version cannot configure)"
            )
    return control, telemetry


def parse_request(data: bytes) -> tuple[Any, str, dict[str, Any]]:
    """Validate one request frame; RequestError names what is wrong."""
    try:
        msg = wire.unpackb(data)
    except Exception as exc:
        raise RequestError("bad_request", f"not a msgpack message: {exc}") from None
    if not isinstance(msg, dict):
        raise RequestError("bad_request", f"request must be a map, got {type(msg).__name__}")
    rid = msg.get("id")
    cmd = msg.get("cmd")
    if not isinstance(cmd, str):
        raise RequestError("bad_request", "field 'cmd' must be a string", rid)
    args = msg.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        kind = type(args).__name__
        raise RequestError("bad_request", f"field 'args' must be a map, got {kind}", rid)
    if cmd not in LANE_COMMANDS | LOCAL_COMMANDS:
        known = ", ".join(sorted(LANE_COMMANDS | LOCAL_COMMANDS))
        raise RequestError("unknown_command", f"unknown cmd {cmd!r} (known: {known})", rid)
    return rid, cmd, args


class OperatorServer:
    """Serves operator requests: reads through the daemon's view, commands the lane."""

    def __init__(
        self,
        view: DaemonView,
        lane: LaneCommands,
        cfg: Config,
        run_dir: Path,
        ctx: zmq.asyncio.Context,
    ) -> None:
        self.view = view
        self.lane = lane
        self.cfg = cfg
        self.control_ep, self.telemetry_ep = endpoints(cfg, run_dir)
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 100)

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        for sock, ep in ((self.sock, self.control_ep), (self.pub, self.telemetry_ep)):
            path = Path(ep.removeprefix("ipc://"))
            path.unlink(missing_ok=True)
            sock.bind(ep)
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IWGRP)
        tg.start_soon(self._serve, tg)
        tg.start_soon(self._telemetry)
        log.info("operator socket %s, telemetry %s", self.control_ep, self.telemetry_ep)

    async def _serve(self, tg: anyio.abc.TaskGroup) -> None:
        try:
            while True:
                frames = await self.sock.recv_multipart()
                if len(frames) < 2:
                    continue
                tg.start_soon(self._answer, frames[0], frames[-1])
        finally:
            self.sock.close(linger=0)
            Path(self.control_ep.removeprefix("ipc://")).unlink(missing_ok=True)

    async def _answer(self, ident: bytes, data: bytes) -> None:
        rid: Any = None
        try:
            rid, cmd, args = parse_request(data)
            result = await self.handle(cmd, args)
            reply = {"id": rid, "ok": True, "result": result}
        except RequestError as exc:
            rid = rid if exc.rid is None else exc.rid
            reply = {"id": rid, "ok": False, "error": {"code": exc.code, "message": str(exc)}}
        except TimeoutError as exc:
            reply = {"id": rid, "ok": False, "error": {"code": "timeout", "message": str(exc)}}
        except LaneBusy as exc:
            reply = {"id": rid, "ok": False, "error": {"code": "busy", "message": str(exc)}}
        await self.sock.send_multipart([ident, wire.packb(reply)])

    async def handle(self, cmd: str, args: dict[str, Any]) -> Any:
        v = self.view
        if cmd in LANE_COMMANDS:
            log.info("operator: %s %s", cmd, args or "")
            reason = args.get("reason", "")
            task = args.get("task", "")
            if not isinstance(reason, str) or not isinstance(task, str):
                raise RequestError("bad_args", "args.reason and args.task must be strings")
            reply = await self.lane.command(cmd, reason=reason[:500], task=task[:2000])
            if not reply.ok:
                raise RequestError(reply.code or "refused", reply.message or "refused")
            return status_dict(reply.status)  # the state the command left, not a later one
        if cmd == "status":
            return {**v.state(), "run_id": v.run_id, "robot": v.robot, "link": v.link()}
        if cmd == "stats":
            return v.summary.to_dict()
        if cmd == "params":
            return self.cfg.model_dump(mode="json")
        if cmd == "verdict":
            success = args.get("success")
            if not isinstance(success, bool):
                raise RequestError("bad_args", "verdict needs args.success: true or false")
            notes = args.get("notes", "")
            if not isinstance(notes, str):
                raise RequestError("bad_args", "verdict args.notes must be a string")
            verdict = {
                "episode": v.state().get("episode", 0),
                "success": success,
                "notes": notes,
                "time": time.time(),
            }
            v.summary.verdicts.append(verdict)
            log.info("verdict %s", verdict)
            return verdict
        raise RequestError("unknown_command", cmd)  # unreachable: parse_request checked

    async def _telemetry(self) -> None:
        period = 1.0 / self.cfg.runtime.telemetry_hz
        try:
            while True:
                await anyio.sleep(period)
                s = self.view.summary
                msg = {
                    "state": self.view.state(),
                    "hz": s.measured_hz(),
                    "lateness_us": s.lateness(),
                    "counters": {
                        **{k: s.count(k) for k in TELEMETRY_COUNTERS},
                        **s.uploads(),
                    },
                    "ask_latency": s.ask_latency(),
                }
                with contextlib.suppress(zmq.Again):  # no subscriber keeping up: skip this one
                    await self.pub.send_multipart([b"status", wire.packb(msg)], zmq.NOBLOCK)
        finally:
            self.pub.close(linger=0)
            Path(self.telemetry_ep.removeprefix("ipc://")).unlink(missing_ok=True)
