"""The act socket's requests as typed messages, decoded straight from their frames by msgspec
and checked field by field (docs/protocol.md): every problem a BadRequest naming the field.

One decoder takes both forms a request may come in: one frame (protocol 1; arrays inside,
extension type 1) and framed (protocol 2; large arrays as frames of their own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from robotd import framed
from robotd.contract import MAX_STREAMS
from robotd.worker.requests import (
    MAX_EPISODE_ID,
    MAX_KEY,
    MAX_STEPS,
    MAX_WAIT_S,
    BadRequest,
    is_int,
    post_values,
)

COMMANDS = "hello, act, end_episode, ping, params"

EpisodeId = Annotated[str, Meta(min_length=1, max_length=MAX_EPISODE_ID)]
StepNo = Annotated[int, Meta(ge=0)]
Key = Annotated[str, Meta(min_length=1, max_length=MAX_KEY)]


MAX_TASK = 2000  # characters of an episode's task text (what an operator typed)


class Hello(Struct, tag="hello", tag_field="cmd"):
    id: int
    observe: Any = None  # true: the client uploads, tell it the observe endpoint
    protocol: int = 1  # the newest protocol the client speaks


class Ping(Struct, tag="ping", tag_field="cmd"):
    id: int
    episode: EpisodeId | None = None


class Params(Struct, tag="params", tag_field="cmd"):
    id: int
    set: Any = UNSET  # checked by robotd.worker.params.check_params


class EndEpisode(Struct, tag="end_episode", tag_field="cmd"):
    id: int
    episode: EpisodeId


class InlineUpload(Struct):
    step: StepNo
    values: Any = None
    frames: Any = None


class Act(Struct, tag="act", tag_field="cmd"):
    """Inline (`observations`) or named (`reads`, with optional `inline` uploads)."""

    id: int
    episode: EpisodeId
    step: StepNo
    steps: Annotated[list[int], Meta(min_length=1, max_length=MAX_STEPS)]
    observations: list[dict[str, Any]] | None = None
    reads: list[Annotated[list[Key], Meta(max_length=MAX_STREAMS)]] | None = None
    inline: list[InlineUpload] | None = None
    release_below: StepNo | None = None
    wait_s: Annotated[float, Meta(ge=0, le=MAX_WAIT_S)] | None = None
    rtc: Any = None  # the frozen prefix (robotd.worker.requests.rtc_value checks it)
    task: Annotated[str, Meta(max_length=MAX_TASK)] = ""  # the episode's task text


Request = Hello | Ping | Params | EndEpisode | Act


class Refused(BadRequest):
    """A request that does not decode as one; `rid` is its id if it has a usable one."""

    def __init__(self, code: str, message: str, rid: int | None) -> None:
        super().__init__(code, message)
        self.rid = rid


def decode(frames: Sequence[framed.Buffer]) -> Request:
    """One request from its frames (after the route); Refused naming the problem."""
    try:
        return framed.unpack(frames, Request)
    except framed.FieldError as err:
        rid = _peek_id(frames)
        if err.field == "cmd" and err.reason.startswith("invalid value "):
            name = err.reason[len("invalid value ") :][:66]
            text = f"field 'cmd': unknown command {name} ({COMMANDS})"
            raise Refused("unknown_command", text, rid) from None
        if err.field == "":
            raise Refused("bad_request", f"request must be a map ({err})", rid) from None
        raise Refused("bad_request", str(err), rid) from None
    except framed.WireError as err:
        bad_msgpack = str(err).startswith("not a valid msgpack")
        what = "is not msgpack" if bad_msgpack else "breaks its framing"
        raise Refused("bad_request", f"request {what}: {err}", _peek_id(frames)) from None


class _Envelope(Struct):
    id: Any = None


_envelope = msgspec.msgpack.Decoder(_Envelope, ext_hook=lambda code, data: None)


def _peek_id(frames: Sequence[framed.Buffer]) -> int | None:
    """A malformed request's id, if its header has one (its error reply then names it)."""
    if not frames or len(frames) > framed.MAX_FRAMES:
        return None
    try:
        rid = _envelope.decode(frames[0]).id
    except (msgspec.DecodeError, RecursionError, ValueError, TypeError):
        return None
    return rid if is_int(rid) else None


def check_steps(act: Act, windowed: bool) -> None:
    """`steps` strictly ascending and ending with `step`; one step for a policy without an
    observation contract."""
    steps = act.steps
    for i in range(1, len(steps)):
        if steps[i] <= steps[i - 1]:
            raise BadRequest(
                "bad_request",
                f"field 'steps[{i}]': {steps[i]} after {steps[i - 1]} (steps must be "
                "strictly ascending)",
            )
    if steps[-1] != act.step:
        raise BadRequest(
            "bad_request",
            f"field 'steps': last entry {steps[-1]} is not the act's own step {act.step}",
        )
    if not windowed and len(steps) != 1:
        raise BadRequest(
            "bad_request",
            f"field 'steps': {len(steps)} steps, but the policy "
            "declares no observation contract (the act carries its own step only)",
        )


def inline_observations(act: Act) -> list[dict[str, Any]]:
    """An act carrying its window inline: its observations, one map per step."""
    given = act.observations
    if given is None or len(given) != len(act.steps):
        got = len(given) if given is not None else "none"
        raise BadRequest(
            "bad_request",
            f"field 'observations': need a list of {len(act.steps)} "
            f"maps (one per entry of steps), got {got}",
        )
    for i, obs in enumerate(given):
        _free(obs, f"observations[{i}]")
    return given


def named_window(act: Act) -> tuple[list[list[str]], dict[int, dict[str, Any]]]:
    """An act naming its steps: (reads, inline uploads by step)."""
    reads = act.reads
    assert reads is not None
    if len(reads) != len(act.steps):
        raise BadRequest(
            "bad_request",
            f"field 'reads': need a list of {len(act.steps)} key lists (one per entry of steps)",
        )
    given = act.inline or []
    if len(given) > len(act.steps):
        raise BadRequest("bad_request", "field 'inline': not a list of at most one upload per step")
    inline: dict[int, dict[str, Any]] = {}
    for i, item in enumerate(given):
        _free(item.values, f"inline[{i}].values")
        _free(item.frames, f"inline[{i}].frames")
        try:
            inline.setdefault(item.step, {}).update(post_values(item.values, item.frames))
        except ValueError as err:
            raise BadRequest("bad_request", f"field 'inline[{i}]': {err}") from None
    return reads, inline


def params_change(msg: Params) -> Any:
    """What a params request sets (UNSET: a read)."""
    if not isinstance(msg.set, UnsetType):
        _free(msg.set, "set")
    return msg.set


def _free(value: Any, field: str) -> None:
    try:
        framed.check_tree(value, f"field '{field}'")
    except framed.WireError as err:
        raise BadRequest("bad_request", str(err)) from None

