"""``trace.frames = "all"``: every frame each camera captured, read out of its
shared-memory ring by the references the tick records carry, into the episode's trace.

Each `Step` names, per camera, the newest frame the control lane saw at that tick
(``cams{name: [index, capture ns]}``). On each step this reads, per camera, every frame
index after the last one it recorded up to the one the step names (at a camera at most as
fast as the control rate: exactly the frames the ticks saw, each once), copies it out of
the ring (the main process's one copy, ~0.1 ms for 640×480) and hands the pixels to the
store, whose writer thread JPEG-encodes them. Nothing here runs in the control lane or
waits on it: the lane has already sent the step and moved on.

A frame gone from its ring (overwritten before the main process got to it: the event loop
was held up for longer than the ring holds, `cameras.*.ring_seconds`) is skipped and
counted (`lost`, the store's `frames_lost`), never waited for and never an error; the
recorder records the count as a ``frames_lost`` event. A full writer queue drops the frame
as it drops any (counted, a ``trace_drop`` event).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from robotd.trace.store import EpisodeWriter

log = logging.getLogger("robotd.trace")


class Ring(Protocol):
    """What is read of a camera ring (robotd.shm.FrameRing)."""

    slots: int
    shape: tuple[int, int, int]

    def read(self, index: int) -> tuple[np.ndarray, int] | None: ...


class CameraFrames:
    """Reads the frames the tick records reference out of `rings` (camera name → ring),
    once per frame index per episode. `reset` at each episode's start: its file then opens
    with the frame its first tick saw."""

    def __init__(self, rings: Mapping[str, Ring]) -> None:
        self.rings = rings
        self._last: dict[str, int] = {}  # per camera: the last frame index dealt with
        self.lost: dict[str, int] = {}  # per camera: frames gone from the ring, in total
        self._failed = False

    def reset(self) -> None:
        self._last.clear()

    def on_step(self, episode: EpisodeWriter, cams: Mapping[str, Any], offset_ns: int) -> int:
        """Record the new frames up to those `cams` names; the number lost doing so."""
        lost = 0
        for camera, ref in cams.items():
            ring = self.rings.get(camera)
            if ref is None or ring is None:
                continue
            index = int(ref[0])
            last = self._last.get(camera)
            if last == index:
                continue
            # after the last one dealt with; from the step's own frame at an episode's start
            # or should the index ever go back (no ring does that: taken as a new start)
            first = index if last is None or index < last else last + 1
            oldest = index - max(1, int(ring.slots)) + 1  # older ones are certainly gone
            if first < oldest:
                lost += oldest - first
                self.lost[camera] = self.lost.get(camera, 0) + oldest - first
                first = oldest
            self._last[camera] = index
            for i in range(first, index + 1):
                lost += self._one(episode, camera, ring, i, offset_ns)
        return lost

    def _one(self, episode: EpisodeWriter, camera: str, ring: Ring, index: int,
             offset_ns: int) -> int:
        h, w, c = ring.shape
        if not episode.frame_room(h * w * c):
            # the writer's queue is full (a catch-up after a stall): dropped and counted
            # before it is copied out of the ring, not after
            return 0
        try:
            got = ring.read(index)
        except Exception as exc:  # a ring closed under us: skipped and counted, said once
            if not self._failed:
                self._failed = True
                log.error("trace: camera %s: cannot read frame %d from its ring: %s",
                          camera, index, exc)
            got = None
        if got is None:
            self.lost[camera] = self.lost.get(camera, 0) + 1
            return 1
        pixels, capture_ns = got  # a fresh array (read copies): the writer's from now on
        episode.frame_pixels(camera, int(capture_ns) + offset_ns, pixels, index)
        return 0
