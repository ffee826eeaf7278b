"""What the worker says, checked: errors, the handshake, an act's chunk (docs/protocol.md).

Every reply is untrusted: each parser checks the fields it reads and raises PolicyError
with code "bad_reply" naming the field that breaks the protocol; a worker's own error
reply becomes PolicyError with its code (and its other fields in `detail`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from robotd import framed
from robotd.contract import Actions, ContractError, Observations
from robotd.contract.answers import dtype_problem
from robotd.finite import all_finite

PROTOCOL = 2  # the newest this client speaks (robotd.framed); it speaks 1 too
PROTOCOLS = (1, 2)
MAX_MISSING = 1 << 16  # (step, key) pairs a missing_steps reply may name
MAX_PARAMS = 64
MAX_ERROR_TEXT = 500  # of a worker error's message, as logged and passed on
MAX_CODE = 64
MAX_INSTANCE_LEN = 64  # a worker process's id, as its hello and pings say it


class PolicyError(Exception):
    """The worker refused a request (`code` from its reply) or broke the protocol
    (`code` "bad_reply"). `detail` holds the error's other fields (e.g. `missing`)."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = detail or {}

    def missing(
        self, window: Mapping[int, Collection[str]] | None = None
    ) -> list[tuple[int, str, str]]:
        """For code "missing_steps": the (step, key, reason) triples the worker named.
        `window`: recorded step -> keys the act reads; a pair outside it is refused.
        PolicyError "bad_reply" naming the entry if the list is malformed."""
        given = self.detail.get("missing", [])
        if not isinstance(given, list) or len(given) > MAX_MISSING:
            raise bad_reply("act", f"field 'error.missing': not a list of at most {MAX_MISSING}")
        out = []
        for item in given:
            ok = (
                isinstance(item, list)
                and len(item) == 3
                and type(item[0]) is int
                and item[0] >= 0
                and isinstance(item[1], str)
                and isinstance(item[2], str)
            )
            if not ok:
                raise bad_reply("act", f"field 'error.missing': bad entry {item!r:.100}")
            if window is not None and item[1] not in window.get(item[0], ()):
                raise bad_reply(
                    "act",
                    f"field 'error.missing': step {item[0]} key {item[1][:64]!r} is not in "
                    "the act's window",
                )
            out.append((item[0], item[1], item[2][:500]))
        return out


@dataclass(slots=True)
class Handshake:
    """What the worker said at connect."""

    observations: Observations | None
    actions: Actions | None
    endpoints: dict[str, str | None]
    policy: str
    limits: dict[str, int] | None = None  # the worker's frame store limits, if it says
    features: frozenset[str] = frozenset()  # what it answers beyond hello/act/end_episode
    params: list[dict[str, Any]] = field(default_factory=list)  # its inference parameters
    protocol: int = 1  # what the link speaks: 2 sends large arrays as frames of their own
    instance: str = ""  # the worker process's own id ("" if it does not say): see ping_instance


@dataclass(slots=True)
class ActResult:
    """A chunk: row i of `actions` (H x D, finite, in the policy's own float dtype,
    read-only: robotd.link.chunks.prepare makes the float64 rows) is meant for step
    `step + i`."""

    actions: np.ndarray
    step: int
    episode: str
    infer_ms: float
    rtt_ms: float
    queue_ms: float = 0.0


def bad_reply(cmd: str, what: str) -> PolicyError:
    return PolicyError("bad_reply", f"reply to {cmd}: {what}")


def unwrap(reply: dict[str, Any], cmd: str) -> dict[str, Any]:
    """The result of a well-formed reply; PolicyError for an error or malformed reply."""
    ok = reply.get("ok")
    if ok is True:
        result = reply.get("result")
        if not isinstance(result, dict):
            raise bad_reply(cmd, f"field 'result': not a map ({type(result).__name__})")
        return result
    if ok is not False:
        raise bad_reply(cmd, f"field 'ok': not a boolean ({ok!r})")
    error = reply.get("error")
    if not isinstance(error, dict):
        raise bad_reply(cmd, f"field 'error': not a map ({type(error).__name__})")
    code, message = error.get("code"), error.get("message")
    if not isinstance(code, str) or not isinstance(message, str):
        raise bad_reply(cmd, f"field 'error': code and message must be strings ({error!r:.200})")
    detail = {k: v for k, v in error.items() if k not in ("code", "message")}
    if len(message) > MAX_ERROR_TEXT:  # it is logged with every failed act
        message = f"{message[:MAX_ERROR_TEXT]}… ({len(message)} characters)"
    raise PolicyError(code[:MAX_CODE], message, detail)


def parse_handshake(result: dict[str, Any]) -> Handshake:
    protocol = result.get("protocol")
    if type(protocol) is not int or protocol not in PROTOCOLS:
        raise bad_reply("hello", f"field 'protocol': {protocol!r:.40}, this client speaks 1 and 2")
    contract = result.get("contract")
    if not isinstance(contract, dict):
        raise bad_reply("hello", f"field 'contract': not a map ({type(contract).__name__})")
    try:
        obs = contract.get("observations")
        observations = None if obs is None else Observations.from_wire(obs, "contract.observations")
        act = contract.get("actions")
        actions = None if act is None else Actions.from_wire(act, "contract.actions")
    except ContractError as err:
        raise bad_reply("hello", str(err)) from None
    endpoints = result.get("endpoints")
    if not isinstance(endpoints, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in endpoints.items()
    ):
        raise bad_reply("hello", "field 'endpoints': not a map of name -> endpoint string or None")
    policy = result.get("policy")
    if not isinstance(policy, str):
        raise bad_reply("hello", f"field 'policy': not a string ({policy!r:.100})")
    limits = result.get("limits")
    if limits is not None and not (
        isinstance(limits, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in limits.values())
    ):
        raise bad_reply(
            "hello", f"field 'limits': not a map of name -> integer > 0 ({limits!r:.100})"
        )
    features, params = _extras(result)
    instance = result.get("instance", "")
    if not (isinstance(instance, str) and len(instance) <= MAX_INSTANCE_LEN):
        raise bad_reply(
            "hello",
            f"field 'instance': not a string of at most {MAX_INSTANCE_LEN} characters"
            f" ({instance!r:.100})",
        )
    return Handshake(
        observations,
        actions,
        dict(endpoints),
        policy,
        limits,
        features,
        params,
        protocol,
        instance,
    )


def _extras(result: dict[str, Any]) -> tuple[frozenset[str], list[dict[str, Any]]]:
    """hello's optional `features` and `params` (a worker without them has neither)."""
    features = result.get("features", [])
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise bad_reply("hello", f"field 'features': not a list of names ({features!r:.100})")
    params = result.get("params", [])
    ok = isinstance(params, list) and len(params) <= MAX_PARAMS
    ok = ok and all(isinstance(p, dict) and isinstance(p.get("name"), str) for p in params)
    if not ok:
        raise bad_reply(
            "hello", f"field 'params': not a list of named parameters ({params!r:.100})"
        )
    return frozenset(f[:64] for f in features[:64]), list(params)


def episode_lost(exc: PolicyError) -> str | None:
    """For an `episode_lost` error, its cause in words (bounded); None for any other."""
    if exc.code != "episode_lost":
        return None
    cause = exc.detail.get("cause")
    cause = cause if isinstance(cause, str) else "lost"
    return f"{cause[:40]}: {exc.message[:300]}"


def ping_instance(result: dict[str, Any]) -> str | None:
    """The worker process a ping's answer comes from, when it says (a string of at most
    MAX_INSTANCE_LEN characters): another than its hello's means the worker restarted."""
    instance = result.get("instance")
    if isinstance(instance, str) and 0 < len(instance) <= MAX_INSTANCE_LEN:
        return instance
    return None


def ping_episode(result: dict[str, Any]) -> tuple[str, str] | None:
    """A ping's word on the episode it was asked about: (state, cause), when it says."""
    episode = result.get("episode")
    if not isinstance(episode, dict):
        return None
    state, cause = episode.get("state"), episode.get("cause")
    if not isinstance(state, str):
        return None
    return state[:40], cause[:300] if isinstance(cause, str) else ""


class _Timing(msgspec.Struct):
    infer_ms: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    queue_ms: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class ActFields(msgspec.Struct):
    """An act's result, typed (the rows are checked apart: an array is no msgspec type)."""

    actions: Any
    step: int
    episode: str
    timing: _Timing


class ActReply(msgspec.Struct):
    """A successful act reply, decoded straight into its types (decode_act_reply)."""

    id: int
    ok: Literal[True]
    result: ActFields


def decode_act_reply(frames: Sequence[Any]) -> ActReply | None:
    """`frames` as a successful act reply, or None when they are anything else (an error,
    another command's reply, a malformed message: for robotd.framed.unpack to say). An
    act's reply is the one that comes every chunk: decoded in one typed pass, with no
    generic tree to walk and convert afterwards."""
    try:
        return framed.unpack(frames, ActReply)
    except framed.WireError:
        return None


def parse_act_result(
    result: dict[str, Any] | ActFields, episode: str, step: int, rtt_ms: float
) -> ActResult:
    """An act's result (a map, or decoded typed by decode_act_reply) checked: its rows a
    2-D float array of finite values (robotd.contract.answers), its step and episode the
    ones asked for."""
    if type(result) is ActFields:
        got = result
    else:
        try:
            got = msgspec.convert(result, ActFields)
        except msgspec.ValidationError as err:
            raise bad_reply("act", str(framed.field_error(str(err)))) from None
    rows = got.actions
    if not isinstance(rows, np.ndarray) or rows.ndim != 2:
        shape = rows.shape if isinstance(rows, np.ndarray) else type(rows).__name__
        raise bad_reply("act", f"field 'actions': not a 2-D numeric array ({shape})")
    problem = dtype_problem(rows.dtype)  # a bool mask or integers are never played as radians
    if problem is not None:
        raise bad_reply("act", f"field 'actions': {problem}")
    if rows.shape[0] < 1 or rows.shape[1] < 1:
        raise bad_reply("act", f"field 'actions': empty chunk of shape {rows.shape}")
    if not all_finite(rows):  # kept as it came: prepare converts it once
        raise bad_reply("act", "field 'actions': holds NaN or infinity")
    if got.step != step:
        raise bad_reply("act", f"field 'step': {got.step!r}, asked for {step}")
    if got.episode != episode:
        raise bad_reply("act", f"field 'episode': {got.episode!r:.100}, asked for {episode!r}")
    timing = got.timing
    return ActResult(rows, step, episode, timing.infer_ms, rtt_ms, timing.queue_ms)
