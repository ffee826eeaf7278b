"""A simulated camera: renders the sim world (drivers.sim.render) into a frame ring.

Frames are taken on absolute deadlines t_open + k / fps. A capture that finds
itself late takes the newest deadline already passed and skips (counts) the
ones missed in between, so a stall never turns into a burst of frames.
"""

from __future__ import annotations

import math
from typing import Literal

import cv2
import numpy as np

from drivers.base import Camera, CameraSpec, DriverContext, DriverFault, DriverOptions, FrameSink
from drivers.sim.render import render
from drivers.sim.world import SimWorld, world_name
from robotd.shm import ShmError

MAX_FAILURES = 10  # bad frames in a row before the camera is declared faulted
WORLD_WAIT_S = 10.0  # how long open() waits for the arm to create the shared world


class SimCamera(Camera):
    """A camera looking at the sim world from above ("top") or from the arm's tip ("wrist").

    Counters: `frames` written, `missed` deadlines skipped because a capture came
    late, `failures` bad frames (skipped, not written). `clock` and `sleep_until`
    form one time base: a custom clock needs its own sleep_until.
    """

    class Options(DriverOptions):
        view: Literal["top", "wrist"] = "top"

    def __init__(
        self,
        spec: CameraSpec,
        options: SimCamera.Options,
        context: DriverContext | None = None,
        *,
        world: SimWorld | None = None,
    ) -> None:
        """`world`: a world of the sim package's own making (the virtual rig); by default
        open() attaches to the run's shared world under context.shm_prefix."""
        context = context or DriverContext()
        name, width, height, fps = spec.name, spec.width, spec.height, spec.fps
        if not isinstance(name, str) or not name:
            raise ValueError(f"SimCamera: name must be a non-empty string, got {name!r}")
        for what, value in (("width", width), ("height", height)):
            if not isinstance(value, int) or not 0 < value <= 8192:
                raise ValueError(f"SimCamera {name!r}: {what} must be an int in 1..8192")
        if not (isinstance(fps, int | float) and math.isfinite(fps) and 0 < fps <= 1000):
            raise ValueError(f"SimCamera {name!r}: fps must be in (0, 1000], got {fps!r}")
        if world is None and context.shm_prefix is None:
            raise ValueError(f"SimCamera {name!r}: needs a world or a shm_prefix to find one")
        if world is not None and world.n_joints < 2:
            raise ValueError(f"SimCamera {name!r}: the world needs >= 2 arm joints")
        self.spec = spec
        self.name = name
        self.fps = float(fps)
        self.options = options
        self._context = context
        self._world = world
        self._own_world = False
        self._clock = context.clock
        self._sleep_until = context.sleep_until
        self._t_open: int | None = None
        self._k = 0  # the next deadline's number
        self._run = 0  # bad frames in a row
        self.frames = 0
        self.missed = 0
        self.failures = 0

    def open(self) -> None:
        """Attach to the shared world (waiting for the arm to make it), then start the
        frame clock: the first deadline is now."""
        if self._world is None:
            assert self._context.shm_prefix is not None
            try:
                self._world = SimWorld.wait_attach(
                    world_name(self._context.shm_prefix),
                    self._sleep_until,
                    self._clock,
                    WORLD_WAIT_S,
                )
            except ShmError as exc:
                raise DriverFault(f"sim camera {self.name!r}: {exc}", joint=self.name) from None
            self._own_world = True
            if self._world.n_joints < 2:
                raise DriverFault(f"sim camera {self.name!r}: the world has < 2 arm joints")
        self._t_open = self._clock()
        self._k = 0
        self._run = 0

    def capture(self, ring: FrameSink) -> int:
        """Wait for the next deadline, render into the ring's next slot, commit; the index.

        A bad frame (world unreadable, ring trouble) is counted and the next deadline
        tried; DriverFault after MAX_FAILURES in a row.
        """
        if self._t_open is None:
            raise DriverFault(f"sim camera {self.name!r} is not open", joint=self.name)
        if tuple(ring.shape) != self.shape:
            raise ValueError(
                f"sim camera {self.name!r}: the sink holds {ring.shape}, camera makes {self.shape}"
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
        assert self._world is not None
        q, _ = self._world.snapshot()
        h, w, _ = self.shape
        return render(self.options.view, w, h, q, (t_ns - self._world.t0_ns) / 1e9)

    def close(self) -> None:
        """Stop; idempotent. The sink belongs to the caller; a world attached by open() is
        detached (the arm owns it)."""
        self._t_open = None
        if self._own_world and self._world is not None:
            self._world.close()
            self._world = None
            self._own_world = False

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

    def _render_into(self, ring: FrameSink, now: int) -> int:
        assert self._world is not None
        q, _ = self._world.snapshot()
        slot = ring.begin()
        try:
            h, w, _ = self.shape
            render(self.options.view, w, h, q, (now - self._world.t0_ns) / 1e9, out=slot)
        except BaseException:
            ring.abort()
            raise
        return ring.commit(now)
