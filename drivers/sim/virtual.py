"""The simulated robot in one process, on a virtual clock: the sim arm and its cameras
sharing a world in process memory (for robotd's virtual-clock runner and benchmarks).

A camera at `fps` shows, at time `now`, the frame captured at the newest
``t0 + k / fps <= now``: the arm's pose and the dot at that instant. `capture_until(now)`
takes each camera's newest capture (integrating the arm to its capture time), `refs()`
names them as the control lane's frame references (index, capture ns), and `frame(name,
ref)` renders one on demand, so frames cost nothing unless a policy window reads them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from drivers.base import CameraSpec, DriverContext
from drivers.sim import render as sim_render
from drivers.sim.arm import SimArm
from drivers.sim.camera import SimCamera
from drivers.sim.world import SimWorld


class VirtualRig:
    """The sim arm (`arm`, a JointDriver) and sim cameras on `clock` (a settable ns clock:
    `clock.now_ns`). `keep_s`: how far back captures stay renderable."""

    def __init__(
        self,
        names: Sequence[str],
        arm_options: Mapping[str, Any],
        cameras: Mapping[str, tuple[CameraSpec, Mapping[str, Any]]],
        clock: Any,
        *,
        seed: int = 0,
        keep_s: float = 4.0,
    ) -> None:
        self.clock = clock
        self.t0 = clock.now_ns
        self.world = SimWorld.local(len(names), self.t0)
        options = SimArm.Options.model_validate({**arm_options, "seed": seed})
        self.arm = SimArm(names, options, DriverContext(clock=clock), world=self.world)
        self.keep_s = keep_s
        self.specs: dict[str, tuple[str, CameraSpec]] = {}
        for name, (spec, opts) in cameras.items():
            view = SimCamera.Options.model_validate(dict(opts)).view
            self.specs[name] = (view, spec)
        self.newest: dict[str, tuple[int, int]] = {}
        self.poses: dict[str, dict[int, tuple[int, np.ndarray]]] = {n: {} for n in self.specs}

    def capture_time(self, name: str, k: int) -> int:
        return self.t0 + round(k * 1e9 / self.specs[name][1].fps)

    def newest_index(self, name: str, now: int) -> int:
        """The largest k with capture_time(k) <= now."""
        fps = self.specs[name][1].fps
        k = max(0, int((now - self.t0) * fps / 1e9))
        while self.capture_time(name, k + 1) <= now:  # float rounding at the edges
            k += 1
        while k > 0 and self.capture_time(name, k) > now:
            k -= 1
        return k

    def capture_until(self, now: int) -> None:
        """Take each camera's newest capture at `now` (the arm integrated to its capture
        time and published to the world); the clock is left at `now`."""
        for name, (_, spec) in self.specs.items():
            k = self.newest_index(name, now)
            if self.newest.get(name, (-1, 0))[0] == k:
                continue
            t = self.capture_time(name, k)
            self.clock.now_ns = t
            self.arm.sync()
            poses = self.poses[name]
            poses[k] = (t, self.world.snapshot()[0])
            oldest = k - math.ceil(self.keep_s * spec.fps) - 1
            while next(iter(poses)) < oldest:  # ascending: captures come in order
                del poses[next(iter(poses))]
            self.newest[name] = (k, t)
        self.clock.now_ns = now

    def refs(self) -> dict[str, tuple[int, int] | None]:
        """Each camera's newest capture as (index, capture ns)."""
        return {name: self.newest.get(name) for name in self.specs}

    def has(self, camera: str) -> bool:
        return camera in self.specs

    def frame(self, camera: str, ref: tuple[int, int]) -> np.ndarray:
        """The frame `ref` names, rendered (read-only, as off the wire); LookupError when it
        is no longer held."""
        got = self.poses[camera].get(int(ref[0]))
        if got is None:
            raise LookupError(f"camera {camera!r} frame {int(ref[0])} is no longer held")
        t, q = got
        view, spec = self.specs[camera]
        image = sim_render.render(view, spec.width, spec.height, q, (t - self.t0) / 1e9)
        image.flags.writeable = False
        return image

    def close(self) -> None:
        self.arm.close()
        self.world.close()
