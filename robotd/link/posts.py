"""The observe connection's records: what one episode may hold on the worker, one upload
as packed, the mirror of what the worker holds, and the worker's acknowledgements checked
(docs/protocol.md, the observe connection)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MB = 1 << 20


@dataclass(frozen=True)
class UplinkLimits:
    """What one episode may hold on the worker (posted and not yet released)."""

    episode_frames: int = 1024
    episode_bytes: int = 64 * MB

    def within(self, worker: Mapping[str, int] | None) -> UplinkLimits:
        """These limits, lowered to what the worker said it keeps (hello's `limits`)."""
        w = worker or {}
        return UplinkLimits(
            min(self.episode_frames, w.get("episode_frames", 1 << 62)),
            min(self.episode_bytes, w.get("episode_bytes", 1 << 62)),
        )


@dataclass(slots=True)
class Post:
    """One upload, packed: a post of `keys` at `step` (`frames` of them camera frames), or
    a skip declaration."""

    wep: str
    step: int
    keys: list[str]
    body: bytes
    frames: int
    rid: int
    skip: bool = False


@dataclass
class Held:
    """The mirror of what the worker holds for one episode."""

    floor: int = 0
    steps: dict[int, list[int]] = field(default_factory=dict)  # step -> [frames, bytes]
    frames: int = 0
    nbytes: int = 0
    through: int = -1

    def add(self, step: int, frames: int, nbytes: int) -> None:
        held = self.steps.setdefault(step, [0, 0])
        held[0] += frames
        held[1] += nbytes
        self.frames += frames
        self.nbytes += nbytes


def parse_ack(reply: dict[str, Any], post: Post) -> tuple[int | None, str | None]:
    """(through, refusal message) of the worker's answer to `post`; ValueError naming the
    field that breaks docs/protocol.md. An error reply counts as a refusal."""
    ok = reply.get("ok")
    if ok is False:
        error = reply.get("error")
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            raise ValueError(f"field 'error': not a map with a string 'message' ({error!r:.100})")
        code = error.get("code")
        return None, f"{code}: {error['message']}" if isinstance(code, str) else error["message"]
    if ok is not True:
        raise ValueError(f"field 'ok': not a boolean ({ok!r:.50})")
    result = reply.get("result")
    if not isinstance(result, dict):
        raise ValueError(f"field 'result': not a map ({type(result).__name__})")
    for name, want in (("episode", post.wep), ("step", post.step)):
        got = result.get(name, want)
        if type(got) is not type(want) or got != want:
            raise ValueError(f"field 'result.{name}': {got!r:.50}, but the upload was {want!r}")
    through = result.get("through")
    if through is not None and (type(through) is not int or through < -1):
        raise ValueError(f"field 'result.through': not an integer >= -1 ({through!r:.50})")
    refused = result.get("refused")
    if refused is None:
        return through, None
    if not (
        isinstance(refused, dict)
        and isinstance(refused.get("code"), str)
        and isinstance(refused.get("message"), str)
    ):
        raise ValueError(
            f"field 'result.refused': not null or a map of string code and message "
            f"({refused!r:.100})"
        )
    return through, refused["message"]
