"""Operator requests, validated before anything acts on them.

A request is one msgpack frame ``{id, cmd, args}``. It is bounded before it is
decoded (MAX_REQUEST_BYTES) and while it is (small container and string limits, no
extension types, MAX_DEPTH levels); each command takes only its own arguments, of
their own types and lengths. What the control lane is sent is built here, small and
validated (`lane_args`), never the request as it came; what is logged is a short
summary (`summary`), never the arguments verbatim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgpack

from robotd.lane.salvage import Salvaged, salvage_estop, split_envelope

MAX_REQUEST_BYTES = 16 * 1024
MAX_DEPTH = 4  # request → args → params.set → a list value
MAX_ITEMS = 64  # entries in any map or list
MAX_ID_LEN = 64
MAX_KEY_LEN = 64
MAX_TEXT = {"reason": 200, "task": 2000, "notes": 2000}
ESTOP_LABEL = "operator e-stop"  # the reason of an e-stop that gave none (or none readable)

# Each command's arguments and their types; anything else is refused.
COMMANDS: dict[str, dict[str, type]] = {
    "status": {},
    "stats": {},
    "params": {"set": dict},
    "verdict": {"success": bool, "notes": str, "replace": bool},
    "start": {"task": str},
    "stop": {},
    "estop": {"reason": str},
    "clear_fault": {},
    "reset_done": {},
}
LANE_COMMANDS = frozenset({"start", "stop", "estop", "clear_fault", "reset_done"})
LOCAL_COMMANDS = frozenset(COMMANDS) - LANE_COMMANDS


class RequestError(Exception):
    """A request refused; `code` and the message go back to the client."""

    def __init__(self, code: str, message: str, rid: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.rid = rid  # the request's id when it could be read: a client matches replies by it


@dataclass(frozen=True, slots=True)
class Request:
    rid: int | str | None
    cmd: str
    args: dict[str, Any] = field(default_factory=dict)
    # CLOCK_MONOTONIC ns when the client sent it (a local client's; the server keeps the
    # earlier of it and its own receipt, so it can only make a command older, never newer)
    sent_ns: int | None = None
    # how long its client waits for the answer (None: it did not say): a command that would
    # move the robot again is not carried out once its client has given up on it
    wait_s: float | None = None


MAX_WAIT_S = 3600.0
ENVELOPE = ("id", "cmd", "args", "sent_ns", "wait_s")  # a request's fields


def _wait_s(msg: dict[str, Any], rid: Any) -> float | None:
    wait = msg.get("wait_s")
    if wait is None:
        return None
    ok = type(wait) in (int, float) and math.isfinite(wait) and 0 < wait <= MAX_WAIT_S
    if not ok:
        raise RequestError(
            "bad_request",
            f"field 'wait_s' must be a number of seconds in (0, {MAX_WAIT_S:g}]",
            rid,
        )
    return float(wait)


def _sent_ns(msg: dict[str, Any], rid: Any) -> int | None:
    sent = msg.get("sent_ns")
    if sent is None:
        return None
    if type(sent) is not int or sent <= 0:
        raise RequestError("bad_request", "field 'sent_ns' must be a positive integer", rid)
    return sent


def _decode(data: bytes) -> Any:
    if len(data) > MAX_REQUEST_BYTES:
        raise RequestError(
            "too_large", f"request of {len(data)} bytes; at most {MAX_REQUEST_BYTES} bytes"
        )
    try:
        msg = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_REQUEST_BYTES,
            max_bin_len=MAX_REQUEST_BYTES,
            max_ext_len=0,
            max_array_len=MAX_ITEMS,
            max_map_len=MAX_ITEMS,
        )
    except msgpack.ExtraData:
        raise RequestError("bad_request", "not a msgpack message: trailing bytes") from None
    except UnicodeDecodeError:
        raise RequestError("bad_request", "not a msgpack message: a string is not UTF-8") from None
    except msgpack.StackError:
        deep = f"request nested deeper than {MAX_DEPTH} levels"
        raise RequestError("bad_request", deep) from None
    except msgpack.FormatError:
        raise RequestError(
            "bad_request", "not a msgpack message: a byte that starts no msgpack value"
        ) from None
    except Exception as exc:  # msgpack raises ValueError, TypeError… with a message
        text = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise RequestError("bad_request", f"not a msgpack message: {text}") from None
    if _too_deep(msg):
        rid = msg.get("id") if isinstance(msg, dict) else None
        ok = rid is None or type(rid) is int or (type(rid) is str and len(rid) <= MAX_ID_LEN)
        raise RequestError(
            "bad_request", f"request nested deeper than {MAX_DEPTH} levels", rid if ok else None
        )
    return msg


def _too_deep(obj: Any) -> bool:
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                return True
            stack.extend(
                (c, depth + 1) for c in (node.values() if isinstance(node, dict) else node)
            )
    return False


def _rid(msg: dict[str, Any]) -> int | str | None:
    rid = msg.get("id")
    if rid is None or (isinstance(rid, int) and not isinstance(rid, bool)):
        return rid
    if isinstance(rid, str) and len(rid) <= MAX_ID_LEN:
        return rid
    raise RequestError("bad_request", "field 'id' must be an integer or a short string")


def _check_args(cmd: str, args: dict[str, Any], rid: Any) -> dict[str, Any]:
    allowed = COMMANDS[cmd]
    unknown = sorted(str(k)[:MAX_KEY_LEN] for k in args if k not in allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) or "no arguments"
        raise RequestError("bad_args", f"{cmd} takes {takes}; unknown: {', '.join(unknown)}", rid)
    for key, value in args.items():
        kind = allowed[key]
        if type(value) is not kind:
            raise RequestError(
                "bad_args",
                f"{cmd} args.{key} must be {kind.__name__}, got {type(value).__name__}",
                rid,
            )
        limit = MAX_TEXT.get(key)
        if limit is not None and len(value) > limit:
            raise RequestError(
                "bad_args", f"{cmd} args.{key} is {len(value)} characters; at most {limit}", rid
            )
    if cmd == "params" and "set" in args:
        for key in args["set"]:
            if len(key) > MAX_KEY_LEN:
                raise RequestError(
                    "bad_args", f"params args.set: key longer than {MAX_KEY_LEN}", rid
                )
    if cmd == "verdict" and "success" not in args:
        raise RequestError("bad_args", "verdict needs args.success: true or false", rid)
    return args


def _salvage(data: bytes) -> Salvaged | None:
    return salvage_estop(
        data,
        kind_key="cmd",
        reason_in_args=True,
        max_bytes=MAX_REQUEST_BYTES,
        max_reason=MAX_TEXT["reason"],
        max_str_id=MAX_ID_LEN,
        label=ESTOP_LABEL,
    )


def split_request(frames: list[bytes]) -> tuple[list[bytes], bytes | None]:
    """(reply envelope, the request frame) of a message as the ROUTER socket has it
    (`split_envelope`): a DEALER sends [id, req], a REQ [id, b"", req]. Any other shape has
    no request frame (None), unless one of its frames holds an e-stop (however malformed
    otherwise)."""
    envelope, bodies = split_envelope(frames)
    if len(bodies) == 1:
        return envelope, bodies[0]
    return envelope, next((f for f in bodies if _salvage(f) is not None), None)


def parse_request(data: bytes) -> Request:
    """Validate one request frame; RequestError names what is wrong (and the id, if read).
    Every e-stop is read by `salvage_estop` alone, strict decoding or not: it is carried out
    whatever else is wrong with its request (a reason of the wrong type is named in its
    place, a long one cut, other fields ignored, a bad id not answered by: the client then
    sees no reply and checks status). Refusing it would leave the robot moving over a typo."""
    got = _salvage(data)
    if got is not None:
        return Request(got.rid, "estop", {"reason": got.reason}, got.sent_ns)
    msg = _decode(data)
    if not isinstance(msg, dict):
        raise RequestError("bad_request", f"request must be a map, got {type(msg).__name__}")
    rid = _rid(msg)
    extra = sorted(str(k)[:MAX_KEY_LEN] for k in msg if k not in ENVELOPE)
    if extra:
        raise RequestError("bad_request", f"unknown request fields: {', '.join(extra)}", rid)
    cmd = msg.get("cmd")
    if not isinstance(cmd, str):
        raise RequestError("bad_request", "field 'cmd' must be a string", rid)
    args = msg.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        kind = type(args).__name__
        raise RequestError("bad_request", f"field 'args' must be a map, got {kind}", rid)
    if cmd not in COMMANDS:
        known = ", ".join(sorted(COMMANDS))
        raise RequestError(
            "unknown_command", f"unknown cmd {cmd[:MAX_KEY_LEN]!r} (known: {known})", rid
        )
    args = _check_args(cmd, args, rid)
    return Request(rid, cmd, args, _sent_ns(msg, rid), _wait_s(msg, rid))


DEFAULT_WAIT_S = 10.0  # how long a client that does not say (wait_s) is taken to wait


def expires_ns(req: Request) -> int:
    """When `req`'s client stops waiting for its answer (CLOCK_MONOTONIC): its time taken
    plus its wait_s, DEFAULT_WAIT_S when it did not say; 0 (never) when not stamped."""
    if not req.sent_ns:
        return 0
    return req.sent_ns + round((req.wait_s or DEFAULT_WAIT_S) * 1e9)


def lane_args(req: Request) -> dict[str, Any]:
    """What the control lane is sent for a lane command: only its own bounded strings."""
    if req.cmd == "estop":
        return {"reason": req.args.get("reason") or ESTOP_LABEL}
    if req.cmd == "start":
        return {"task": req.args.get("task", "")}
    return {}


def _clip(text: str, limit: int = 40) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def summary(args: dict[str, Any]) -> str:
    """The arguments in a few words for a log line: short strings quoted and cut, maps as
    their key count, never the whole value."""
    parts = []
    for key, value in list(args.items())[:8]:
        if isinstance(value, str):
            parts.append(
                f"{key}={_clip(value)} ({len(value)} chars)"
                if len(value) > 40
                else f"{key}={_clip(value)}"
            )
        elif isinstance(value, dict):
            parts.append(f"{key}={{{len(value)} keys}}")
        else:
            parts.append(f"{key}={value!r}"[:60])
    return " ".join(parts)
