"""An episode's trace as arrays, for export: joint states, targets, tick times, cameras.

Ticks are small and loaded whole; frames are large and streamed one camera at a time
(`camera_frames`), so exporting a long episode never holds its video in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robotd.trace import codec
from robotd.trace.reader import TraceReader
from robotd.trace.rundir import read_json
from robotd.trace.schemas import (
    CAMERA_PREFIX,
    CUT_OFF,
    TICK,
    camera_topic,
    is_camera_topic,
)

log = logging.getLogger("robotd.trace")


class EpisodeDataError(ValueError):
    """An episode that cannot be exported as it is; the text names the file and why."""


@dataclass
class EpisodeData:
    path: Path
    meta: dict[str, Any]  # the start metadata (episode, task, run, hz, tick_every, joints)
    state: np.ndarray  # (T, J) float64 joint positions
    action: np.ndarray  # (T, J) float64 targets played (the position where none was sent)
    log_time: np.ndarray  # (T,) int64 ns
    held: np.ndarray  # (T,) bool
    # (T,) bool: steps an overrun skipped (nothing read or played: the record repeats the
    # last observation); empty for data made without them
    skipped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    cameras: list[str] = field(default_factory=list)
    # per camera, the frame index each tick referenced (its `cams`; -1: none)
    refs: dict[str, np.ndarray] = field(default_factory=dict)
    outcome: str | None = None
    cause: str = ""  # a fault's cause (estop, driver, ...), "" for none
    verdict: dict[str, Any] | None = None
    note: str = ""  # the reader's word on a file that was not closed cleanly

    @property
    def ticks(self) -> int:
        return len(self.log_time)

    def rate(self) -> float | None:
        hz, every = self.meta.get("hz"), self.meta.get("tick_every") or 1
        if isinstance(hz, int | float) and hz > 0 and isinstance(every, int) and every >= 1:
            return float(hz) / every
        return None


def _vector(value: Any, n: int | None, what: str, path: Path, i: int) -> list[float]:
    if not isinstance(value, list) or (n is not None and len(value) != n):
        raise EpisodeDataError(f"{path}: tick {i}: {what} is not a list of {n} numbers")
    out = []
    for v in value:
        if v is None:  # a non-finite value the writer could not restore
            out.append(float("nan"))
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out.append(float(v))
        else:
            raise EpisodeDataError(f"{path}: tick {i}: {what} holds {type(v).__name__}")
    return out


def _text(value: Any) -> str | None:
    return None if value is None else str(value)[:1000]


def _verdict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _refs(refs: dict[str, list[int]], cams: Any, i: int) -> None:
    """Tick `i`'s frame references into `refs` (a malformed one is no reference: -1)."""
    for cam, ref in (cams.items() if isinstance(cams, dict) else ()):
        got = refs.setdefault(str(cam), [])
        got.extend([-1] * (i - len(got)))  # ticks before it named this camera
        ok = isinstance(ref, list | tuple) and len(ref) == 2 and type(ref[0]) is int
        got.append(ref[0] if ok and ref[0] >= 0 else -1)


def load_episode(path: Path) -> EpisodeData:
    """Read an episode's ticks (all of them, in order) and find its cameras."""
    reader = TraceReader(path)
    states, actions, times, held, skipped, cameras = [], [], [], [], [], []
    refs: dict[str, list[int]] = {}
    n: int | None = None
    last_action: list[float] | None = None
    for msg in reader.messages():
        if is_camera_topic(msg.topic):
            cam = msg.topic[len(CAMERA_PREFIX) :]
            if cam not in cameras:
                cameras.append(cam)
            continue
        if msg.topic != TICK:
            continue
        r, i = msg.record, len(times)
        pos = _vector(r.get("pos"), n, "pos", path, i)
        n = len(pos)
        target = r.get("target")
        if target is not None:
            last_action = _vector(target, n, "target", path, i)
        # no target written (fault, torque off): the robot stays where it is
        actions.append(last_action if last_action is not None else pos)
        states.append(pos)
        times.append(msg.log_time)
        held.append(bool(r.get("held")))
        skipped.append(r.get("skipped") is True)
        _refs(refs, r.get("cams"), i)
    side = read_json(path.with_suffix(".json")) or {}
    end = reader.end or {}
    j = n or 0
    return EpisodeData(
        path=path,
        meta=reader.episode,
        state=np.asarray(states, dtype=np.float64).reshape(len(states), j),
        action=np.asarray(actions, dtype=np.float64).reshape(len(actions), j),
        log_time=np.asarray(times, dtype=np.int64),
        held=np.asarray(held, dtype=bool),
        skipped=np.asarray(skipped, dtype=bool),
        cameras=cameras,
        refs={cam: np.asarray(v + [-1] * (len(times) - len(v)), dtype=np.int64)
              for cam, v in refs.items()},
        outcome=_text(side.get("outcome") or end.get("outcome")) or (
            None if side.get("ended") or reader.end else CUT_OFF),
        cause=_text(side.get("cause") or end.get("cause")) or "",
        verdict=_verdict(side.get("verdict") if side.get("verdict") is not None
                         else end.get("verdict")),
        note="" if reader.status.complete else reader.status.message,
    )


def camera_frames(path: Path, camera: str) -> Iterator[tuple[int, bytes, int]]:
    """(log_time, compressed bytes, frame index or -1) of one camera's frames, in file
    order."""
    for msg in TraceReader(path).messages([camera_topic(camera)]):
        index = msg.record.get("frame_index") if isinstance(msg.record, dict) else None
        try:
            yield (msg.log_time, codec.frame_bytes(msg.record),
                   index if type(index) is int and index >= 0 else -1)
        except codec.DecodeError as exc:
            log.warning("export: %s: a %s frame skipped: %s", path.name, camera, exc)
