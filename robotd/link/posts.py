"""The observe connection's records: what one episode may hold on the worker, one upload
as packed, the mirror of what the worker holds, and the worker's acknowledgements checked
(docs/protocol.md, the observe connection), or said in words when they acknowledge nothing
waiting."""

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


def stray_words(reply: Any, nbytes: int, sent: int) -> str:
    """One bounded sentence saying what an observe reply that acknowledges no upload waiting
    for it was: `reply` as decoded (or the WireError its bytes raised), `nbytes` its size,
    `sent` the newest upload id sent (ids run from 1). Whatever the worker sent, never the
    bytes themselves, and never an exception."""
    if isinstance(reply, Exception):
        return f"dropped an undecodable reply ({nbytes} bytes: {str(reply)[:120]})"
    if not isinstance(reply, dict):
        return f"dropped a reply that is a {type(reply).__name__}, not a map ({nbytes} bytes)"
    rid = reply.get("id")
    if type(rid) is not int:  # a bool is no id (True is not upload 1)
        return f"dropped a reply naming no upload (its id: {rid!r:.40}; {nbytes} bytes)"
    if not 1 <= rid <= sent:
        return f"dropped a reply naming upload {rid}, which was never sent ({nbytes} bytes)"
    result = reply.get("result")
    episode = result.get("episode") if isinstance(result, dict) else None
    step = result.get("step") if isinstance(result, dict) else None
    said = ""
    if isinstance(episode, str) and type(step) is int:
        said = f" (of episode {episode[:64]!r} step {step}, it says)"
    return (
        f"dropped the worker's answer to upload {rid}{said}: nothing waits for it any more "
        "(its episode ended before the answer came, or it was answered already)"
    )
