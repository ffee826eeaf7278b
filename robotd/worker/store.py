"""The worker's bounded frame store: what the observe connection uploaded, by episode and step.

The poll loop of the worker owns it (one thread, no locking). A daemon posts the keys read at
a step (`post`), declares steps it will never send (`skip`), and its acts name the steps and
keys they read (`lookup`); an act that is handed to the policy releases the steps no later
act of its episode can read (`release`). Frames are kept as they travelled (encoded) and
decoded on other threads, so the poll loop never spends time on pixels: each frame kept is
handed to `on_frame` (the worker decodes it ahead of the acts, see Frame).

Contract:
- (episode, step, key) is kept once: a post of keys already held is acknowledged the same
  and adds nothing.
- Limits (StoreLimits): frames and bytes held per episode, bytes held by the whole worker.
  A post over a limit is refused (nothing of it kept) with a `Refusal` naming the limit; an
  act reading a refused key is answered at once (it is `lost`, with the refusal's message)
  until the key is posted again and kept.
- Bytes are counted as received (the post's message size), so a daemon can mirror them.
  Skip declarations count too, `SKIP_ENTRY_BYTES` a (step, key); a skip over a limit, naming
  a key outside `keys` (the contract's streams, when known) or more keys than there are
  streams is refused.
- An episode's frames are freed by `drop` (end_episode), when its owner (the observe
  connection that posted it) starts a newer episode, or after `idle_s` without a post.
- `through(episode)`: the highest step up to which the store holds (or was told to skip)
  every step posted to it; a refused step holds it below that step until it is released.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from robotd.worker.frame import Frame

MB = 1 << 20
SKIP_ENTRY_BYTES = 128  # what one declared-skipped (step, key) is charged against the limits
MAX_SKIP_KEYS = 64  # keys one skip may name when the contract's streams are not known


@dataclass(frozen=True)
class StoreLimits:
    """What one worker holds at most (defaults: those of `robotd serve`)."""

    episode_frames: int = 1024
    episode_bytes: int = 64 * MB
    worker_bytes: int = 1024 * MB
    idle_s: float = 600.0  # an episode without a post this long is freed (its daemon is gone)
    decoded_bytes: int = 256 * MB  # frames decoded ahead of their acts (robotd.worker.server)

    def to_wire(self) -> dict[str, int]:
        return {
            "episode_frames": self.episode_frames,
            "episode_bytes": self.episode_bytes,
            "worker_bytes": self.worker_bytes,
        }


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a post or skip was not kept: code episode_frames | episode_bytes | worker_bytes |
    released | bad_skip."""

    code: str
    message: str


@dataclass(slots=True)
class Lookup:
    """An act's window from the store: `observations` when complete; otherwise the (step, key)
    pairs not arrived yet (`waiting`) and those that never will (`lost`, with a reason)."""

    observations: list[dict[str, Any]] | None
    waiting: list[tuple[int, str]]
    lost: list[tuple[int, str, str]]


@dataclass
class _Episode:
    owner: bytes
    touched: float
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    sizes: dict[int, list[int]] = field(default_factory=dict)  # step -> [frames, bytes]
    skipped: dict[int, dict[str, str]] = field(default_factory=dict)  # step -> key -> reason
    refused: dict[int, dict[str, str]] = field(default_factory=dict)  # step -> key -> why
    frames: int = 0
    nbytes: int = 0
    floor: int = 0  # steps below were released
    top: int = -1  # highest step posted or skipped


def count_frames(values: Mapping[str, Any]) -> int:
    return sum(isinstance(v, Frame) for v in values.values())


class FrameStore:
    """Uploaded observations of every episode a worker serves, within `limits`."""

    def __init__(
        self,
        limits: StoreLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        keys: Iterable[str] | None = None,
        on_frame: Callable[[str, Frame], None] | None = None,
    ) -> None:
        self.limits = limits or StoreLimits()
        self.keys = frozenset(keys) if keys is not None else None  # the contract's streams
        self.on_frame = on_frame  # called with each frame kept (to decode it ahead)
        self._clock = clock
        self._episodes: dict[str, _Episode] = {}
        self.nbytes = 0  # held by the whole worker

    # ---- what the observe connection sends --------------------------------------------------

    def post(
        self, owner: bytes, episode: str, step: int, values: Mapping[str, Any], nbytes: int
    ) -> tuple[int, Refusal | None]:
        """Keep the keys of `values` read at `step` (Frame instances count as frames, the
        post costs `nbytes`); returns (through, None) or (through, Refusal)."""
        ep = self._episode(owner, episode)
        if step < ep.floor:
            return self.through(episode), Refusal(
                "released",
                f"episode {episode!r} step {step} is below {ep.floor}, released "
                "by an act: no later act reads it",
            )
        held = ep.steps.setdefault(step, {})
        new = {k: v for k, v in values.items() if k not in held}
        if not new:
            return self.through(episode), None  # a repeat: acknowledged the same, kept once
        frames = count_frames(new)
        refusal = self._over_limit(episode, ep, step, frames, nbytes)
        if refusal is not None:
            if not held:
                del ep.steps[step]
            ep.refused.setdefault(step, {}).update(
                dict.fromkeys(new, f"refused: {refusal.message}")
            )
            return self.through(episode), refusal
        held.update(new)
        self._charge(ep, step, frames, nbytes)
        if self.on_frame is not None:
            for key, value in new.items():
                if isinstance(value, Frame):
                    self.on_frame(key, value)
        refused = ep.refused.get(step)
        if refused is not None:
            for key in new:
                refused.pop(key, None)
            if not refused:
                del ep.refused[step]
        ep.top = max(ep.top, step)
        return self.through(episode), None

    def skip(
        self, owner: bytes, episode: str, step: int, keys: Sequence[str], reason: str
    ) -> tuple[int, Refusal | None]:
        """The daemon will never send `keys` at `step` (lost robot-side): acts reading them
        are answered at once instead of waiting. Returns (through, None) or (through,
        Refusal): a key outside the contract, too many keys, or over a limit."""
        ep = self._episode(owner, episode)
        what = f"episode {episode!r} step {step}: skip refused"
        allowed = self.keys
        if len(keys) > (len(allowed) if allowed is not None else MAX_SKIP_KEYS):
            return self.through(episode), Refusal(
                "bad_skip", f"{what}: {len(keys)} keys, more than the contract has streams"
            )
        unknown = sorted(set(keys) - allowed) if allowed is not None else []
        if unknown:
            return self.through(episode), Refusal(
                "bad_skip", f"{what}: {unknown[:4]} are not streams of the contract"
            )
        if step < ep.floor:
            return self.through(episode), None  # released already: nobody will wait for it
        held = ep.steps.get(step, {})
        marks = ep.skipped.get(step, {})
        new = [k for k in dict.fromkeys(keys) if k not in held and k not in marks]
        nbytes = SKIP_ENTRY_BYTES * len(new)
        refusal = self._over_limit(episode, ep, step, 0, nbytes)
        if refusal is not None:
            return self.through(episode), Refusal(refusal.code, f"skip: {refusal.message}")
        if new:
            ep.skipped.setdefault(step, {}).update(dict.fromkeys(new, reason))
            self._charge(ep, step, 0, nbytes)
        ep.top = max(ep.top, step)
        return self.through(episode), None

    def _charge(self, ep: _Episode, step: int, frames: int, nbytes: int) -> None:
        size = ep.sizes.setdefault(step, [0, 0])
        size[0] += frames
        size[1] += nbytes
        ep.frames += frames
        ep.nbytes += nbytes
        self.nbytes += nbytes

    def _episode(self, owner: bytes, episode: str) -> _Episode:
        now = self._clock()
        self._expire(now, keep=episode)
        ep = self._episodes.get(episode)
        if ep is None:
            # A newer episode of the same daemon: its older episodes are over.
            for old in [e for e, v in self._episodes.items() if v.owner == owner]:
                self.drop(old)
            ep = self._episodes[episode] = _Episode(owner, now)
        ep.owner, ep.touched = owner, now
        return ep

    def _expire(self, now: float, keep: str) -> None:
        idle = [
            e
            for e, v in self._episodes.items()
            if e != keep and now - v.touched > self.limits.idle_s
        ]
        for episode in idle:
            self.drop(episode)

    def _over_limit(
        self, episode: str, ep: _Episode, step: int, frames: int, nbytes: int
    ) -> Refusal | None:
        lim = self.limits
        what = f"episode {episode!r} step {step} refused"
        if ep.frames + frames > lim.episode_frames:
            return Refusal(
                "episode_frames",
                f"{what}: the episode would hold "
                f"{ep.frames + frames} frames (limit {lim.episode_frames})",
            )
        if ep.nbytes + nbytes > lim.episode_bytes:
            return Refusal(
                "episode_bytes",
                f"{what}: the episode would hold "
                f"{ep.nbytes + nbytes} bytes (limit {lim.episode_bytes})",
            )
        if self.nbytes + nbytes > lim.worker_bytes:
            return Refusal(
                "worker_bytes",
                f"{what}: the worker would hold "
                f"{self.nbytes + nbytes} bytes (limit {lim.worker_bytes})",
            )
        return None

    # ---- what acts do -----------------------------------------------------------------------

    def lookup(
        self,
        episode: str,
        steps: Sequence[int],
        reads: Sequence[Sequence[str]],
        inline: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> Lookup:
        """The observations of an act reading `reads[i]` at `steps[i]` (a step below 0 reads
        step 0); a value in `inline` (source step -> key -> value) wins over the store."""
        ep = self._episodes.get(episode)
        inline = inline or {}
        out: list[dict[str, Any]] = []
        waiting: list[tuple[int, str]] = []
        lost: list[tuple[int, str, str]] = []
        for step, keys in zip(steps, reads):
            source = max(step, 0)
            given = inline.get(source, {})
            held = ep.steps.get(source, {}) if ep is not None else {}
            obs: dict[str, Any] = {}
            for key in keys:
                if key in given:
                    obs[key] = given[key]
                elif key in held:
                    obs[key] = held[key]
                elif ep is not None and key in ep.skipped.get(source, {}):
                    lost.append((source, key, ep.skipped[source][key]))
                elif ep is not None and key in ep.refused.get(source, {}):
                    lost.append((source, key, ep.refused[source][key]))
                elif ep is not None and source < ep.floor:
                    lost.append((source, key, f"released (below step {ep.floor})"))
                else:
                    waiting.append((source, key))
            out.append(obs)
        done = not waiting and not lost
        return Lookup(out if done else None, waiting, lost)

    def release(self, episode: str, below: int) -> None:
        """Free the steps of `episode` below `below` (no later act reads them)."""
        ep = self._episodes.get(episode)
        if ep is None or below <= ep.floor:
            return
        for step in [s for s in ep.sizes if s < below]:
            frames, nbytes = ep.sizes.pop(step)
            ep.frames -= frames
            ep.nbytes -= nbytes
            self.nbytes -= nbytes
        for step in [s for s in ep.steps if s < below]:
            _drop_frames(ep.steps.pop(step))
        for table in (ep.skipped, ep.refused):
            for step in [s for s in table if s < below]:
                del table[step]
        ep.floor = below

    def drop(self, episode: str) -> None:
        """Forget `episode` and free everything it held."""
        ep = self._episodes.pop(episode, None)
        if ep is not None:
            self.nbytes -= ep.nbytes
            for values in ep.steps.values():
                _drop_frames(values)

    # ---- state ------------------------------------------------------------------------------

    def through(self, episode: str) -> int:
        """The highest step up to which every step posted (or declared skipped) is held."""
        ep = self._episodes.get(episode)
        if ep is None:
            return -1
        if ep.refused:
            return min(ep.refused) - 1
        return max(ep.top, ep.floor - 1)

    def held(self, episode: str) -> tuple[int, int]:
        """(frames, bytes) held for `episode`."""
        ep = self._episodes.get(episode)
        return (0, 0) if ep is None else (ep.frames, ep.nbytes)

    def episodes(self) -> list[str]:
        return list(self._episodes)

    def steps_held(self, episode: str) -> list[int]:
        ep = self._episodes.get(episode)
        return sorted(ep.steps) if ep is not None else []


def _drop_frames(values: Mapping[str, Any]) -> None:
    for value in values.values():
        if isinstance(value, Frame):
            value.released = True
