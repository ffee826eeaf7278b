"""Steps on the main side: the ring of recent step records, and the one reader that turns
"(episode, step, key)" into a value, or says why it cannot (the frame was lost).

Every consumer reads through `StepReader`: the act link (windows sent inline), the uplink
(uploads ahead) and the virtual runner (in-process asks). Camera frames come from a
`FrameSource`: the shared-memory frame rings on the wall clock, the virtual rig's renders
on the virtual clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from robotd.lane.messages import FrameRef, Step
from robotd.link.reservoir import Reservoir
from robotd.shm import FrameRing

UPLOAD_COUNTERS = (
    "uploaded_frames",
    "uploaded_bytes",
    "inline_frames",
    "skipped_frames",
    "refused_frames",
)
TIMING_SAMPLE = 10_000  # act round trips kept for percentiles (a uniform sample of the run)
JOINT_KEYS = ("joints.pos", "joints.vel")


class FrameLost(Exception):
    """A value a window needs is gone: its frame was overwritten before it was read, the
    camera had none at that step, or the step is no longer held."""


@dataclass
class LinkCounters:
    """The policy link's counters. Frames: camera frames (skipped = declared lost robot-side
    or given up when behind; refused = the worker would not keep them); bytes: uploads as
    sent (messages, frames and values). `rtt_ms`: each act's round trip from its ask to its
    chunk, `infer_ms`: the policy's own time as it reports it; both bounded uniform samples."""

    acts: int = 0
    act_errors: int = 0
    skipped_frames: int = 0
    uploaded_frames: int = 0
    uploaded_bytes: int = 0
    inline_frames: int = 0
    refused_frames: int = 0
    reconnects: int = 0
    unknown_acks: int = 0  # observe acknowledgements naming no upload of ours: dropped
    rtt_ms: Reservoir = field(default_factory=lambda: Reservoir(TIMING_SAMPLE))
    infer_ms: Reservoir = field(default_factory=lambda: Reservoir(TIMING_SAMPLE, seed=1))

    def uploads(self) -> dict[str, int]:
        """The upload counters of the summary and telemetry."""
        return {name: getattr(self, name) for name in UPLOAD_COUNTERS}


class StepRing:
    """The recent steps of the present worker-side episode, by step number.

    Keeps `keep` steps back from the newest; a new episode id empties it, so a window can
    never read another episode's steps.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.wep = ""
        self._steps: dict[int, Step] = {}
        self.newest = -1

    def add(self, rec: Step) -> None:
        if rec.wep != self.wep:
            self.wep = rec.wep
            self._steps.clear()
            self.newest = -1
        self._steps[rec.s] = rec
        self.newest = max(self.newest, rec.s)
        self._steps.pop(rec.s - self.keep, None)

    def get(self, wep: str, step: int) -> Step | None:
        if wep != self.wep:
            return None
        return self._steps.get(step)


class FrameSource(Protocol):
    """Camera frames by the reference a step recorded."""

    def has(self, camera: str) -> bool:
        """Whether `camera` is one of this source's cameras."""
        ...

    def frame(self, camera: str, ref: FrameRef) -> np.ndarray:
        """The frame (HWC uint8) `ref` names; FrameLost saying why when it is gone."""
        ...


class RingFrames:
    """Frames out of the shared-memory camera rings (copies: the ring overwrites)."""

    def __init__(self, rings: Mapping[str, FrameRing]) -> None:
        self.rings = rings

    def has(self, camera: str) -> bool:
        return camera in self.rings

    def frame(self, camera: str, ref: FrameRef) -> np.ndarray:
        got = self.rings[camera].read(int(ref[0]))
        if got is None:
            raise FrameLost("frame overwritten in its camera ring before it was read")
        return got[0]


@dataclass(slots=True)
class StepRead:
    """What a step holds of some keys: values, frames, and (key, why) for each lost."""

    values: dict[str, Any] = field(default_factory=dict)
    frames: dict[str, np.ndarray] = field(default_factory=dict)
    lost: list[tuple[str, str]] = field(default_factory=list)


def joint_value(rec: Step, key: str) -> np.ndarray:
    """A joint stream's value in a step record; KeyError for a key that is not one."""
    if key == "joints.pos":
        value = np.asarray(rec.pos, dtype=np.float64)
    elif key == "joints.vel":
        value = np.asarray(rec.vel, dtype=np.float64)
    else:
        raise KeyError(f"unknown observation key {key!r}")
    value.flags.writeable = False  # as off the wire: the policy must copy to modify
    return value


class StepReader:
    """Reads keys of recorded steps: joint values from the step ring, frames from the
    frame source. Never raises for a missing step or frame: it says why (StepRead.lost),
    or `value` raises FrameLost with the reason."""

    def __init__(self, steps: StepRing, frames: FrameSource) -> None:
        self.steps = steps
        self.frames = frames

    def read(self, wep: str, step: int, keys: Iterable[str]) -> StepRead:
        out = StepRead()
        rec = self.steps.get(wep, step)
        for key in sorted(keys):
            if rec is None:
                out.lost.append((key, "step no longer held robot-side"))
            elif self.frames.has(key):
                ref = rec.cams.get(key)
                if ref is None:
                    out.lost.append((key, "the camera had no frame at that step"))
                    continue
                try:
                    out.frames[key] = self.frames.frame(key, ref)
                except FrameLost as exc:
                    out.lost.append((key, str(exc)))
            else:
                try:
                    out.values[key] = joint_value(rec, key)
                except KeyError as err:
                    out.lost.append((key, f"not in the step record ({err})"))
        return out

    def value(self, wep: str, step: int, key: str) -> Any:
        """One key's value at a step; FrameLost naming the step, key and reason."""
        got = self.read(wep, step, (key,))
        if got.lost:
            raise FrameLost(f"step {step} of episode {wep} {key!r}: {got.lost[0][1]}")
        return got.frames[key] if key in got.frames else got.values[key]
