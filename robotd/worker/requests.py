"""Parsing the worker's requests (docs/protocol.md): every field checked, every problem a
BadRequest naming the field."""

from __future__ import annotations

from typing import Any

from robotd.contract import MAX_STREAMS
from robotd.worker.store import Frame

MAX_STEPS = 65536
MAX_EPISODE_ID = 256
MAX_WAIT_S = 600.0


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
        raise BadRequest("bad_request", "field 'episode': missing or not a string of "
                         f"1..{MAX_EPISODE_ID} characters ({str(episode)[:64]!r})")
    return episode


def act_fields(msg: dict[str, Any], windowed: bool) -> tuple[int, list[int], list[dict]]:
    """An act carrying its observations inline: (step, steps, observations)."""
    step, steps = steps_fields(msg, windowed)
    observations = msg.get("observations")
    if not isinstance(observations, list) or len(observations) != len(steps):
        got = len(observations) if isinstance(observations, list) else type(observations).__name__
        raise BadRequest("bad_request", f"field 'observations': need a list of {len(steps)} "
                         f"maps (one per entry of steps), got {got}")
    for i, obs in enumerate(observations):
        if not isinstance(obs, dict):
            raise BadRequest("bad_request", f"field 'observations[{i}]': not a map "
                             f"({type(obs).__name__})")
    return step, steps, observations


def steps_fields(msg: dict[str, Any], windowed: bool) -> tuple[int, list[int]]:
    step, steps = msg.get("step"), msg.get("steps")
    if not is_int(step) or step < 0:
        raise BadRequest("bad_request", f"field 'step': missing or not an integer >= 0 ({step!r})")
    if not isinstance(steps, list) or not 0 < len(steps) <= MAX_STEPS:
        raise BadRequest("bad_request", f"field 'steps': missing or not a list of 1..{MAX_STEPS} "
                         "step numbers")
    for i, s in enumerate(steps):
        if not is_int(s):
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
    return step, steps


def named_act_fields(msg: dict[str, Any], windowed: bool, default_wait_s: float
                      ) -> tuple[int, list[int], list[list[str]], dict[int, dict[str, Any]],
                                 int | None, float]:
    """An act that names its steps: (step, steps, reads, inline, release_below, wait_s)."""
    step, steps = steps_fields(msg, windowed)
    reads = msg.get("reads")
    if not isinstance(reads, list) or len(reads) != len(steps):
        raise BadRequest("bad_request", f"field 'reads': need a list of {len(steps)} key lists "
                         "(one per entry of steps)")
    for i, keys in enumerate(reads):
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise BadRequest("bad_request", f"field 'reads[{i}]': not a list of keys")
    inline: dict[int, dict[str, Any]] = {}
    given = msg.get("inline", [])
    if not isinstance(given, list) or len(given) > len(steps):
        raise BadRequest("bad_request", "field 'inline': not a list of at most one upload "
                         "per step")
    for i, item in enumerate(given):
        s = item.get("step") if isinstance(item, dict) else None
        if not is_int(s) or s < 0:
            raise BadRequest("bad_request", f"field 'inline[{i}].step': missing or not an "
                             "integer >= 0")
        try:
            inline.setdefault(s, {}).update(post_values(item.get("values"),
                                                              item.get("frames")))
        except ValueError as err:
            raise BadRequest("bad_request", f"field 'inline[{i}]': {err}") from None
    below = msg.get("release_below")
    if below is not None and (not is_int(below) or below < 0):
        raise BadRequest("bad_request", f"field 'release_below': not an integer >= 0 ({below!r})")
    wait_s = msg.get("wait_s", default_wait_s)
    if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not (
            0 <= wait_s <= MAX_WAIT_S):
        raise BadRequest("bad_request", f"field 'wait_s': not a number of seconds in "
                         f"0..{MAX_WAIT_S:g} ({wait_s!r})")
    return step, steps, reads, inline, below, float(wait_s)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)




def post_values(values: Any, frames: Any) -> dict[str, Any]:
    """The keys of one upload: plain `values` as they are, `frames` (encoded camera frames,
    robotd.link.fit.to_wire) wrapped as Frame, to be decoded on the policy thread."""
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
