"""Parsing the observe connection's uploads (docs/protocol.md), every field checked and every
problem a BadRequest naming the field; the bounds the act socket's requests share
(robotd.worker.commands); and the worker's endpoints."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robotd.contract import MAX_RTC_DIM, MAX_RTC_ROWS, MAX_STREAMS
from robotd.stream.endpoint import is_stream, parse, zmq_equivalent
from robotd.worker.frame import Frame

MAX_STEPS = 65536
MAX_EPISODE_ID = 256
MAX_WAIT_S = 600.0
MAX_KEY = 256  # characters in an observation key named by a skip
_RTC_KEYS = frozenset({"delay", "prefix", "rest"})


class BadRequest(ValueError):
    """A request the worker refuses; `code` goes into the error reply."""

    def __init__(self, code: str, message: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra or {}


def request_id(msg: Any) -> int:
    if not isinstance(msg, dict):
        raise BadRequest("bad_request", f"request must be a map, got {type(msg).__name__}")
    rid = msg.get("id")
    if not is_int(rid):
        raise BadRequest("bad_request", f"field 'id': missing or not an integer ({rid!r})")
    return rid


def episode_field(msg: dict[str, Any]) -> str:
    episode = msg.get("episode")
    if not isinstance(episode, str) or not 0 < len(episode) <= MAX_EPISODE_ID:
        raise BadRequest(
            "bad_request",
            "field 'episode': missing or not a string of "
            f"1..{MAX_EPISODE_ID} characters ({str(episode)[:64]!r})",
        )
    return episode


def rtc_field(msg: dict[str, Any]) -> dict[str, Any] | None:
    """An act's optional `rtc` ({"delay": int >= 1, "prefix": (p x D), "rest": (r x D)},
    p <= delay, finite numbers) as the policy is handed it: float64 arrays, read-only."""
    return rtc_value(msg.get("rtc"))


def rtc_value(rtc: Any) -> dict[str, Any] | None:
    """An act's `rtc` field's value checked (rtc_field)."""
    if rtc is None:
        return None
    if not isinstance(rtc, dict) or set(rtc) != _RTC_KEYS:
        got = sorted(map(str, rtc))[:8] if isinstance(rtc, dict) else type(rtc).__name__
        raise BadRequest(
            "bad_request", f"field 'rtc': need a map of delay, prefix and rest (got {got})"
        )
    delay = rtc["delay"]
    if not is_int(delay) or not 1 <= delay <= MAX_RTC_ROWS:
        raise BadRequest(
            "bad_request", f"field 'rtc.delay': not an integer in 1..{MAX_RTC_ROWS} ({delay!r})"
        )
    rows = {name: _rtc_rows(rtc[name], name) for name in ("prefix", "rest")}
    if rows["prefix"].shape[1] != rows["rest"].shape[1]:
        raise BadRequest(
            "bad_request",
            f"field 'rtc': prefix rows of {rows['prefix'].shape[1]} values, rest rows of "
            f"{rows['rest'].shape[1]}",
        )
    if rows["prefix"].shape[0] > delay:
        raise BadRequest(
            "bad_request",
            f"field 'rtc.prefix': {rows['prefix'].shape[0]} rows for a delay of {delay}",
        )
    return {"delay": delay, **rows}


def _rtc_rows(value: Any, name: str) -> np.ndarray:
    where = f"field 'rtc.{name}'"
    if not isinstance(value, np.ndarray) or value.ndim != 2 or value.dtype.kind not in "biuf":
        shape = value.shape if isinstance(value, np.ndarray) else type(value).__name__
        raise BadRequest("bad_request", f"{where}: not a 2-D numeric array ({shape})")
    if value.shape[0] > MAX_RTC_ROWS or not 1 <= value.shape[1] <= MAX_RTC_DIM:
        raise BadRequest(
            "bad_request",
            f"{where}: shape {value.shape} (at most {MAX_RTC_ROWS} rows of 1..{MAX_RTC_DIM})",
        )
    rows = value.astype(np.float64)
    if not np.isfinite(rows).all():
        raise BadRequest("bad_request", f"{where}: holds NaN or infinity")
    rows.flags.writeable = False
    return rows


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def post_values(values: Any, frames: Any) -> dict[str, Any]:
    """The keys of one upload: plain `values` as they are, `frames` (encoded camera frames,
    robotd.frames.to_wire) wrapped as Frame, to be decoded on the policy thread."""
    values = {} if values is None else values
    frames = {} if frames is None else frames
    for name, given in (("values", values), ("frames", frames)):
        if not isinstance(given, dict):
            raise ValueError(f"field '{name}': not a map of key -> value")
        for key in given:
            if not isinstance(key, str) or not key:
                raise ValueError(f"field '{name}': key {key!r} is not a non-empty string")
    both = set(values) & set(frames)
    if both:
        raise ValueError(f"keys {sorted(both)} are in both 'values' and 'frames'")
    if len(values) + len(frames) > MAX_STREAMS:
        raise ValueError(f"{len(values) + len(frames)} keys (at most {MAX_STREAMS})")
    for key, msg in frames.items():
        if not isinstance(msg, dict):
            raise ValueError(f"field 'frames.{key}': not a frame message (codec, shape, data)")
    return {**values, **{k: Frame(m) for k, m in frames.items()}}


@dataclass(frozen=True, slots=True)
class Upload:
    """One message of the observe connection: a post (values) or a skip (keys, reason)."""

    cmd: str
    episode: str
    step: int
    values: dict[str, Any]
    keys: list[str]
    reason: str


def upload_fields(msg: dict[str, Any]) -> Upload:
    cmd = msg.get("cmd")
    if cmd not in ("post", "skip"):
        raise BadRequest(
            "unknown_command", f"field 'cmd': unknown upload command {str(cmd)[:64]!r} (post, skip)"
        )
    episode = episode_field(msg)
    step = msg.get("step")
    if not is_int(step) or step < 0:
        raise BadRequest("bad_request", f"field 'step': missing or not an integer >= 0 ({step!r})")
    if cmd == "post":
        try:
            values = post_values(msg.get("values"), msg.get("frames"))
        except ValueError as err:
            raise BadRequest("bad_request", str(err)) from None
        return Upload(cmd, episode, step, values, [], "")
    keys, reason = msg.get("keys"), msg.get("reason", "")
    if (
        not isinstance(keys, list)
        or len(keys) > MAX_STREAMS
        or not all(isinstance(k, str) and 0 < len(k) <= MAX_KEY for k in keys)
    ):
        raise BadRequest(
            "bad_request",
            f"field 'keys': not a list of at most {MAX_STREAMS} keys of 1..{MAX_KEY} characters",
        )
    if not isinstance(reason, str):
        raise BadRequest("bad_request", f"field 'reason': not a string ({type(reason).__name__})")
    return Upload(cmd, episode, step, {}, keys, reason[:200])


SHAPES = {
    "tcp": "tcp://HOST:PORT",
    "ipc": "ipc://PATH",
    "stream+tcp": "stream+tcp://HOST:PORT",
    "stream+ipc": "stream+ipc://PATH",
    "inproc": "inproc://NAME",
}


def check_bind_endpoint(endpoint: str, what: str, *, stream: bool) -> None:
    """ValueError naming `what` (e.g. "--bind") and what is wrong with `endpoint` when the
    worker cannot bind it: no scheme, a scheme it does not serve (the accepted ones are
    listed; `stream`: the byte-stream ones too), no path, a tcp port that is no number."""
    schemes = [s for s in SHAPES if stream or not s.startswith("stream+")]
    accepted = ", ".join(SHAPES[s] for s in schemes)
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        raise ValueError(f"{what} {endpoint!r}: no scheme; accepted: {accepted}")
    if scheme not in schemes:
        raise ValueError(
            f"{what} {endpoint!r}: scheme {scheme!r} is not served; accepted: {accepted}"
        )
    if scheme.startswith("stream+"):
        parse(endpoint, bind=True)  # EndpointError (a ValueError) saying what is wrong
        return
    if not rest:
        raise ValueError(f"{what} {endpoint!r}: nothing after {scheme}://, want {SHAPES[scheme]}")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        number = port.isdigit() and int(port) <= 65535
        if not colon or not host or not (number or port == "*"):
            raise ValueError(f"{what} {endpoint!r}: want tcp://HOST:PORT (PORT 0-65535 or *)")


def observe_endpoint(bind: str) -> str:
    """The observe endpoint that goes with act endpoint `bind`: ipc `x.sock` -> `x-o.sock`,
    tcp port P -> P + 1 (port 0 stays 0: any free port), inproc `n` -> `n-observe`; for
    stream+ipc:// and stream+tcp:// the same ZeroMQ endpoints (uploads are ZeroMQ)."""
    if is_stream(bind):  # the act link on a byte stream; uploads stay ZeroMQ
        return observe_endpoint(zmq_equivalent(bind))
    if bind.startswith("ipc://"):
        path = Path(bind[len("ipc://") :])
        return "ipc://" + str(path.with_name(f"{path.stem}-o{path.suffix}"))
    if bind.startswith("tcp://"):
        host, sep, port = bind[len("tcp://") :].rpartition(":")
        if sep and port.isdigit() and 0 < int(port) < 65535:
            return f"tcp://{host}:{int(port) + 1}"
        if sep and port in ("0", "*"):
            return bind
    if bind.startswith("inproc://"):
        return bind + "-observe"
    raise ValueError(
        f"cannot derive an observe endpoint from {bind!r}; give one explicitly (--observe)"
    )


def prepare_ipc(bind: str) -> None:
    """ipc endpoints: create the socket file's directory."""
    path = ipc_path(bind)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)


def remove_ipc(endpoint: str) -> None:
    """libzmq leaves a bound ipc socket file behind; remove ours (only if still a socket)."""
    path = ipc_path(endpoint)
    if path is not None and path.is_socket():
        with contextlib.suppress(OSError):
            path.unlink()


def ipc_path(endpoint: str) -> Path | None:
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        if path and not path.startswith("@"):  # '@': Linux abstract namespace, no file
            return Path(path)
    return None
