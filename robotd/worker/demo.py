"""The demo policy: follow the red dot of the simulated world with the arm's tip.

`robotd serve robotd.demo:DotFollower` serves it. Each act it finds the dot in the top
camera's two frames (now and `lookback` steps ago), estimates the dot's velocity, predicts
where the dot will be at each of the chunk's steps, and answers the joint angles that put
the tip there (inverse kinematics of drivers.sim.geometry). Joints past the first two (the
gripper, ...) keep their current value.

It reads the top camera as real policies do: 224 x 224, letterboxed, JPEG (`CAMERA`), so
a frame costs a few kB on the wire instead of the 900 kB of a raw 640 x 480 one; the dot's
colour is matched with a tolerance that JPEG's chroma loss needs.

It speaks real-time chunking by default (`rtc=False` answers from the window alone):
handed the act's frozen prefix (the rows the robot plays while it computes) it answers
those rows as they are, then blends the offset between the prefix's last row and its own
plan out over the next few rows (guided inpainting in its simplest honest form), removing
at most `blend_step` of it per row: a small offset goes at once, a large one over as many
rows as that bound needs, so no seam adds more than `blend_step` to one step of the
robot's path.
"""

from __future__ import annotations

import math
import time
from typing import Any

import cv2
import numpy as np

from drivers.sim import geometry
from robotd.contract import Actions, Camera, Observations, Stream

# What a real policy declares: a small letterboxed JPEG, fitted and encoded robot-side.
CAMERA = Camera(width=224, height=224, resize="pad", codec="jpeg", quality=90)
JPEG_TOLERANCE = 60  # per channel around DOT_COLOUR: JPEG shifts colours near edges


def _observations(lookback: int) -> Observations:
    return Observations(
        streams={"top": Stream(at=[-lookback, 0], camera=CAMERA), "joints.pos": Stream()}
    )


class DotFollower:
    """Plans `horizon` rows at `hz`; row i is meant for step t + i (t: the act's step).

    latency_ms: artificial inference time (sleeps). lookback: steps between the two frames
    the velocity is estimated from. colour_tolerance: per-channel slack around DOT_COLOUR
    (JPEG_TOLERANCE suits the declared JPEG camera; 0 matches raw frames exactly). rtc:
    take the frozen prefix and continue it (module doc); blend_step: the most of the seam's
    offset the blend removes per row (joint units, > 0).
    """

    observations = _observations(3)
    actions = Actions(hz=30.0, open_loop_horizon=8, rtc=True)

    def __init__(
        self,
        latency_ms: float = 0.0,
        horizon: int = 16,
        lookback: int = 3,
        hz: float = 30.0,
        colour_tolerance: int = JPEG_TOLERANCE,
        rtc: bool = True,
        blend_step: float = 0.03,
    ) -> None:
        if horizon < 1 or lookback < 1 or not hz > 0 or latency_ms < 0 or not blend_step > 0:
            raise ValueError(
                f"DotFollower: need horizon >= 1, lookback >= 1, hz > 0, latency_ms >= 0 "
                f"and blend_step > 0 (got {horizon}, {lookback}, {hz}, {latency_ms}, "
                f"{blend_step})"
            )
        self.latency_ms = float(latency_ms)
        self.horizon = int(horizon)
        self.hz = float(hz)
        self.rtc = bool(rtc)
        self.blend_step = float(blend_step)
        self.observations = _observations(int(lookback))
        self.actions = Actions(hz=self.hz, open_loop_horizon=min(8, self.horizon), rtc=self.rtc)
        colour = np.array(geometry.DOT_COLOUR, dtype=np.int32)
        self._lo = np.clip(colour - colour_tolerance, 0, 255).astype(np.uint8)
        self._hi = np.clip(colour + colour_tolerance, 0, 255).astype(np.uint8)

    def infer(
        self,
        inputs: dict[str, Any],
        *,
        episode: str | None = None,
        rtc: dict[str, Any] | None = None,
    ) -> np.ndarray:
        """(horizon, D) joint targets, D = len(joints.pos) of the act's own step; with rtc,
        the first rows are the frozen prefix, then a blend into the plan."""
        rows = self._plan(inputs)
        if self.rtc and rtc is not None:
            return self.continue_prefix(rows, np.asarray(rtc.get("prefix", ())))
        return rows

    def continue_prefix(self, plan: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        """`plan` with its first p rows replaced by the prefix (p x D) and the offset at the
        seam (prefix[-1] − plan[p − 1]) blended out linearly over the fewest rows that
        remove at most blend_step of it per row."""
        if prefix.ndim != 2 or prefix.shape[0] == 0 or prefix.shape[1] != plan.shape[1]:
            return plan
        p = min(prefix.shape[0], plan.shape[0])
        out = plan.copy()
        out[:p] = prefix[:p]
        offset = prefix[p - 1] - plan[p - 1]
        rows = math.ceil(float(np.abs(offset).max()) / self.blend_step - 1e-9) - 1
        n = min(max(0, rows), plan.shape[0] - p)
        fade = 1.0 - np.arange(1, n + 1) / (rows + 1)
        out[p : p + n] += fade[:, None] * offset
        return out

    def _plan(self, inputs: dict[str, Any]) -> np.ndarray:
        """The plan from the act's window alone (what a non-rtc act answers)."""
        if self.latency_ms:
            time.sleep(self.latency_ms / 1e3)
        observations, steps = _window(inputs)
        now = observations[-1]
        if "joints.pos" not in now:
            raise ValueError("DotFollower: the act's observation has no 'joints.pos'")
        q = np.asarray(now["joints.pos"], dtype=np.float64).reshape(-1)
        seen = [(s, self.find_dot(o["top"])) for s, o in zip(steps, observations) if "top" in o]
        seen = [(s, p) for s, p in seen if p is not None]
        if not seen or q.size < 2:
            return np.tile(q, (self.horizon, 1))  # nothing to follow: hold the current pose
        (s1, p1), (s0, p0) = seen[-1], seen[0]
        velocity = (p1 - p0) * self.hz / (s1 - s0) if s1 > s0 else np.zeros(2)
        # Row i is for step t + i; the newest dot position was seen at step s1 <= t.
        ahead = (steps[-1] - s1 + np.arange(self.horizon)) / self.hz
        return self.plan(p1 + ahead[:, None] * velocity, q)

    def find_dot(self, frame: Any) -> np.ndarray | None:
        """World position of the dot's centroid in a top-camera frame (HxWx3 uint8 RGB)."""
        if (
            not isinstance(frame, np.ndarray)
            or frame.dtype != np.uint8
            or frame.ndim != 3
            or frame.shape[2] != 3
            or frame.shape[0] == 0
            or frame.shape[1] == 0
        ):
            return None
        mask = cv2.inRange(frame, self._lo, self._hi)
        m = cv2.moments(mask, binaryImage=True)
        if m["m00"] == 0:
            return None
        # A letterboxed frame shows the view in its middle, at the view's aspect ratio.
        h, w = frame.shape[:2]
        x0, y0, x1, y1 = geometry.TOP_VIEW
        aspect = (x1 - x0) / (y1 - y0)
        inner_w, inner_h = min(w, round(h * aspect)), min(h, round(w / aspect))
        u = m["m10"] / m["m00"] - (w - inner_w) // 2
        v = m["m01"] / m["m00"] - (h - inner_h) // 2
        return geometry.pixel_to_world(u, v, geometry.TOP_VIEW, inner_w, inner_h)

    def plan(self, targets: np.ndarray, q: np.ndarray) -> np.ndarray:
        """Joint rows putting the tip at each target, continuing from the pose q."""
        rows = np.tile(q, (len(targets), 1))
        prev = q[:2]
        for i, p in enumerate(targets):
            prev = _nearest_branch(p, prev)
            rows[i, :2] = prev
        return rows


def _window(inputs: Any) -> tuple[list[dict[str, Any]], list[int]]:
    """(observations, steps) of a windowed act; a bare observation is a one-step window."""
    if isinstance(inputs, dict) and "observations" in inputs and "steps" in inputs:
        return list(inputs["observations"]), [int(s) for s in inputs["steps"]]
    return [inputs], [0]


def _nearest_branch(p: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """The IK solution (elbow up or down) closest to prev, angles unwrapped next to prev."""
    best, best_cost = prev, math.inf
    for elbow_up in (False, True):
        q = geometry.inverse(p, elbow_up=elbow_up)
        q = prev + (q - prev + math.pi) % (2 * math.pi) - math.pi
        cost = float(np.abs(q - prev).sum())
        if cost < best_cost:
            best, best_cost = q, cost
    return best
