"""A simulated camera: renders the sim world (drivers.sim.render) into a frame ring.

Frames are taken on absolute deadlines t_open + k / fps. A capture that finds
itself late takes the newest deadline already passed and skips (counts) the
ones missed in between, so a stall never turns into a burst of frames.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Literal

import cv2
import numpy as np
import pydantic

from drivers.base import Camera, DriverFault
from drivers.sim.render import render
from drivers.sim.world import SimWorld
from robotd.shm import FrameRing, ShmError

MAX_FAILURES = 10  # bad frames in a row before the camera is declared faulted


def sleep_until_monotonic(deadline_ns: int) -> None:
    """Sleep until time.monotonic_ns() reaches deadline_ns (no-op if already past)."""
    delay = (deadline_ns - time.monotonic_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)


class SimCamera(Camera):
    """A camera looking at the sim world from above ("top") or from the arm's tip ("wrist").

    Counters: `frames` written, `missed` deadlines skipped because a capture came
    late, `failures` bad frames (skipped, not written). `clock` and `sleep_until`
    form one time base: a custom clock needs its own sleep_until.
    """

    class Options(pydantic.BaseModel, extra="forbid"):
        view: Literal["top", "wrist"] = "top"

    def __init__(
        self,
        name: str,
        width: int,
        height: int,
        fps: float,
        options: SimCamera.Options,
        *,
        world: SimWorld,
        clock: Callable[[], int] = time.monotonic_ns,
        sleep_until: Callable[[int], None] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"SimCamera: name must be a non-empty string, got {name!r}")
        for what, value in (("width", width), ("height", height)):
            if not isinstance(value, int) or not 0 < value <= 8192:
                raise ValueError(f"SimCamera {name!r}: {what} must be an int in 1..8192")
        if not (isinstance(fps, int | float) and math.isfinite(fps) and 0 < fps <= 1000):
            raise ValueError(f"SimCamera {name!r}: fps must be in (0, 1000], got {fps!r}")
        if world.n_joints < 2:
            raise ValueError(f"SimCamera {name!r}: the world needs >= 2 arm joints")
        if sleep_until is None:
            if clock is not time.monotonic_ns:
                raise ValueError(f"SimCamera {name!r}: a custom clock needs its sleep_until")
            sleep_until = sleep_until_monotonic
        self.name = name
        self.shape = (height, width, 3)
        self.fps = float(fps)
        self.options = options
        self._world = world
        self._clock = clock
        self._sleep_until = sleep_until
        self._t_open: int | None = None
        self._k = 0  # the next deadline's number
        self._run = 0  # bad frames in a row
        self.frames = 0
        self.missed = 0
        self.failures = 0

    def open(self) -> None:
        """Start the frame clock: the first deadline is now."""
        self._t_open = self._clock()
        self._k = 0
        self._run = 0

    def capture(self, ring: FrameRing) -> int:
        """Wait for the next deadline, render into the ring's next slot, commit; the index.

        A bad frame (world unreadable, ring trouble) is counted and the next deadline
        tried; DriverFault after MAX_FAILURES in a row.
        """
        if self._t_open is None:
            raise DriverFault(f"sim camera {self.name!r} is not open", joint=self.name)
        if ring.shape != self.shape:
            raise ValueError(
                f"sim camera {self.name!r}: ring {ring.name!r} holds {ring.shape}, "
                f"camera makes {self.shape}"
            )
        while True:
            now = self._wait_next()
            try:
                index = self._render_into(ring, now)
            except (ShmError, ValueError, cv2.error) as exc:
                self.failures += 1
                self._run += 1
                if self._run >= MAX_FAILURES:
                    raise DriverFault(
                        f"sim camera {self.name!r}: {self._run} bad frames in a row, last: {exc}",
                        joint=self.name,
                    ) from exc
                continue
            self._run = 0
            self.frames += 1
            return index

    def render_now(self, t_ns: int) -> np.ndarray:
        """The frame this camera would capture at t_ns (for in-process, virtual-clock use)."""
        q, _ = self._world.snapshot()
        h, w, _ = self.shape
        return render(self.options.view, w, h, q, (t_ns - self._world.t0_ns) / 1e9)

    def close(self) -> None:
        """Stop; idempotent. The world and the ring belong to the caller."""
        self._t_open = None

    # ---- internals ----------------------------------------------------------------

    def _deadline(self, k: int) -> int:
        assert self._t_open is not None
        return self._t_open + round(k * 1e9 / self.fps)

    def _wait_next(self) -> int:
        """Sleep to the next deadline (or skip missed ones); return the capture time."""
        k = self._k
        now = self._clock()
        if now < self._deadline(k):
            self._sleep_until(self._deadline(k))
            now = self._clock()
        else:
            newest = self._newest_deadline_before(now)
            if newest > k:
                self.missed += newest - k
                k = newest
        self._k = k + 1
        return now

    def _newest_deadline_before(self, now: int) -> int:
        """The largest k with deadline(k) <= now."""
        assert self._t_open is not None
        k = max(0, int((now - self._t_open) * self.fps / 1e9))
        while self._deadline(k + 1) <= now:  # float rounding at the edges
            k += 1
        while k > 0 and self._deadline(k) > now:
            k -= 1
        return k

    def _render_into(self, ring: FrameRing, now: int) -> int:
        q, _ = self._world.snapshot()
        _, slot = ring.begin()
        try:
            h, w, _ = self.shape
            render(self.options.view, w, h, q, (now - self._world.t0_ns) / 1e9, out=slot)
        except BaseException:
            ring.abort()
            raise
        return ring.commit(now)
