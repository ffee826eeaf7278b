"""The demo policy: follow the red dot of the simulated world with the arm's tip.

`robotd serve robotd.demo:DotFollower` serves it. Each act it finds the dot in the top
camera's two frames (now and `lookback` steps ago), estimates the dot's velocity, predicts
where the dot will be at each of the chunk's steps, and answers the joint angles that put
the tip there (inverse kinematics of drivers.sim.geometry). Joints past the first two (the
gripper, ...) are not steered: they hold, for the whole episode, the value read at its first
act, within the sim arm's stops (drivers.sim.arm; `lower`/`upper` to say others). A joint
resting at a stop reads a little past it half the time (read noise): echoing each act's
reading would have the shield clip every row of half the chunks, and walk the joint about.

It reads the top camera as real policies do: 224 x 224, letterboxed, JPEG (`CAMERA`), so
a frame costs a few kB on the wire instead of the 900 kB of a raw 640 x 480 one; the dot's
colour is matched with a tolerance that JPEG's chroma loss needs.

It speaks real-time chunking by default (`rtc=False` answers from the window alone):
handed the act's frozen prefix (the rows the robot plays while it computes) it answers
those rows as they are, then blends the offset between the prefix's last row and its own
plan out over the next few rows (guided inpainting in its simplest honest form), removing
at most `blend_step` of it per row: a small offset goes at once, a large one over as many
rows as that bound needs, so no seam adds more than `blend_step` to one step of the
robot's path. The robot plays the prefix and then holds its last row (with no prefix: holds
where it is) until the act's predicted delay has passed, so the answer keeps those rows too
and blends from there: the episode's first chunk joins the arm where it rests rather than
jumping to the dot.

`sample_noise` (0: off) models a sampled policy (diffusion or flow matching, as openpi's pi0):
such a policy draws each chunk afresh, so two chunks planned for the same steps disagree by
sampling noise even when the scene has not changed. Each act then draws a smooth deviation
for every steered joint, an offset plus a half and a full cosine wave across the chunk's
rows (`SAMPLE_TERMS`), of root-mean-square `sample_noise` joint units per row, and adds it
to the plan before any prefix is kept: with rtc the answer still starts with the prefix it
is handed (the previous sample's rows) and blends into its own new sample. The sample, and
rtc's blend into it after the kept rows, stay within the joints' limits (`lower`/`upper`),
as a trained policy's samples stay within the range of its data: the dot's path takes the
sim's elbow within 0.1 of its stop (the exact plan, 400 ms ahead, a little past it), and
unbounded samples there have the shield reject five rows in a row and fault. `seed` fixes
the draws (every copy of the policy made with one seed draws the same samples); they are a
stream of their own (`SAMPLE_STREAM`), so a sim arm seeded alike does not read the same
numbers as its read noise.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

import cv2
import numpy as np

from drivers.sim import geometry
from drivers.sim.arm import ARM_LOWER, ARM_UPPER, GRIPPER_LOWER, GRIPPER_UPPER
from robotd.contract import Actions, Camera, Observations, Stream

# What a real policy declares: a small letterboxed JPEG, fitted and encoded robot-side.
CAMERA = Camera(width=224, height=224, resize="pad", codec="jpeg", quality=90)
JPEG_TOLERANCE = 60  # per channel around DOT_COLOUR: JPEG shifts colours near edges
HOLD_KEY = "dotfollower.hold"  # Episode.state: the values the unsteered joints hold
STEERED = 2  # the joints the plan steers (the arm's); the others hold
SAMPLE_TERMS = 3  # a sample's deviation per joint: an offset, a half and a full cosine wave
SAMPLE_STREAM = 0x5A  # the samples' numpy spawn key: a stream apart from others seeded alike


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
    offset the blend removes per row (joint units, > 0). sample_noise, seed: each chunk a
    fresh sample, off its exact plan by a smooth deviation of that RMS (joint units, >= 0;
    module doc). lower/upper: the joints' limits,
    one value per joint each, as the robot config's (default: the sim arm's stops, 0..1 for
    every joint past the arm); the joints it does not steer are held within them (the arm's
    rows are its inverse kinematics, which the shield limits).
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
        lower: list[float] | None = None,
        upper: list[float] | None = None,
        sample_noise: float = 0.0,
        seed: int = 0,
    ) -> None:
        if horizon < 1 or lookback < 1 or not hz > 0 or latency_ms < 0 or not blend_step > 0:
            raise ValueError(
                f"DotFollower: need horizon >= 1, lookback >= 1, hz > 0, latency_ms >= 0 "
                f"and blend_step > 0 (got {horizon}, {lookback}, {hz}, {latency_ms}, "
                f"{blend_step})"
            )
        if not (math.isfinite(sample_noise) and sample_noise >= 0):
            raise ValueError(
                f"DotFollower: sample_noise must be finite and >= 0, got {sample_noise}"
            )
        self.sample_noise = float(sample_noise)
        self._rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(SAMPLE_STREAM,)))
        self.limits = _limits(lower, upper)
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
        the first rows are the frozen prefix (and the hold after it), then a blend into the
        plan. With sample_noise, the plan is this act's sample (module doc)."""
        rows, pose = self._plan(inputs, episode)
        within = self._steered_limits(min(STEERED, rows.shape[1])) if self.sample_noise else None
        if within is not None:
            sample = rows[:, :STEERED] + self._deviation(rows.shape[0], within[0].size)
            rows[:, :STEERED] = np.clip(sample, *within)
        if self.rtc and rtc is not None:
            prefix = np.asarray(rtc.get("prefix") if rtc.get("prefix") is not None else ())
            delay = rtc.get("delay")
            delay = int(delay) if isinstance(delay, numbers.Integral) else 0
            return self.continue_prefix(rows, prefix, delay=delay, pose=pose, within=within)
        return rows

    def continue_prefix(
        self,
        plan: np.ndarray,
        prefix: np.ndarray,
        *,
        delay: int = 0,
        pose: np.ndarray | None = None,
        within: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray:
        """`plan` with its first rows frozen and the offset at the seam blended out linearly
        over the fewest rows that remove at most blend_step of it per row.

        The frozen rows: the prefix (p x D), then its last row again up to `delay` rows (the
        robot holds it until the answer lands); with no prefix, `pose` (where the robot
        holds) for `delay` rows. The seam's offset is frozen[-1] − plan[f − 1]. `within`:
        (lower, upper) of the first joints, the rows after the frozen ones kept in them (a
        sample's bounds; module doc)."""
        seam = _frozen(prefix, plan.shape[1], delay, pose)
        if seam is None:
            return plan
        f = min(seam.shape[0], plan.shape[0])
        out = plan.copy()
        out[:f] = seam[:f]
        offset = seam[f - 1] - plan[f - 1]
        rows = math.ceil(float(np.abs(offset).max()) / self.blend_step - 1e-9) - 1
        n = min(max(0, rows), plan.shape[0] - f)
        fade = 1.0 - np.arange(1, n + 1) / (rows + 1)
        out[f : f + n] += fade[:, None] * offset
        if within is not None:
            j = within[0].size
            out[f:, :j] = np.clip(out[f:, :j], *within)
        return out

    def _steered_limits(self, joints: int) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) of the first `joints` joints (the steered ones): as given, or
        the sim arm's stops."""
        if self.limits is None:
            return np.full(joints, ARM_LOWER), np.full(joints, ARM_UPPER)
        return self.limits[0][:joints], self.limits[1][:joints]

    def _deviation(self, rows: int, joints: int) -> np.ndarray:
        """(rows, joints): this sample's smooth deviation from the exact plan, a fresh draw
        of SAMPLE_TERMS cosine coefficients per joint; the terms have unit mean square over
        the rows, so the deviation's RMS is about sample_noise."""
        u = np.arange(rows) / max(1, rows - 1)
        k = np.arange(SAMPLE_TERMS)
        basis = np.where(k == 0, 1.0, math.sqrt(2.0)) * np.cos(math.pi * np.outer(u, k))
        coef = self._rng.standard_normal((SAMPLE_TERMS, joints))
        return basis @ coef * (self.sample_noise / math.sqrt(SAMPLE_TERMS))

    def _plan(
        self, inputs: dict[str, Any], episode: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The plan from the act's window alone (what a non-rtc act answers), and the pose
        the robot is taken to hold now (the arm joints as read, the others as held)."""
        if self.latency_ms:
            time.sleep(self.latency_ms / 1e3)
        observations, steps = _window(inputs)
        now = observations[-1]
        if "joints.pos" not in now:
            raise ValueError("DotFollower: the act's observation has no 'joints.pos'")
        q = np.asarray(now["joints.pos"], dtype=np.float64).reshape(-1)
        lo, hi = self._bounds(q.size)
        pose = q.copy()
        pose[2:] = self._held(np.minimum(np.maximum(q[2:], lo), hi), episode)
        seen = [(s, self.find_dot(o["top"])) for s, o in zip(steps, observations) if "top" in o]
        seen = [(s, p) for s, p in seen if p is not None]
        if not seen or q.size < 2:
            return np.tile(pose, (self.horizon, 1)), pose  # nothing to follow: hold the pose
        (s1, p1), (s0, p0) = seen[-1], seen[0]
        velocity = (p1 - p0) * self.hz / (s1 - s0) if s1 > s0 else np.zeros(2)
        # Row i is for step t + i; the newest dot position was seen at step s1 <= t.
        ahead = (steps[-1] - s1 + np.arange(self.horizon)) / self.hz
        return self.plan(p1 + ahead[:, None] * velocity, pose), pose

    def _bounds(self, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """The limits of the joints past the arm of a robot with `dim` joints: as given, or
        the sim arm's stops for them."""
        if self.limits is None:
            extra = max(0, dim - 2)
            return np.full(extra, GRIPPER_LOWER), np.full(extra, GRIPPER_UPPER)
        lo, hi = self.limits
        if lo.size != dim:
            raise ValueError(
                f"DotFollower: lower/upper hold {lo.size} values, the robot has {dim} joints"
            )
        return lo[2:], hi[2:]

    @staticmethod
    def _held(values: np.ndarray, episode: str | None) -> np.ndarray:
        """What the joints past the arm hold: the values of the episode's first act (kept in
        its state), so read noise is never chased act by act; `values` without one."""
        state = getattr(episode, "state", None)
        if not isinstance(state, dict):
            return values
        held = state.get(HOLD_KEY)
        if not isinstance(held, np.ndarray) or held.shape != values.shape:
            state[HOLD_KEY] = held = values.copy()
        return held

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


def _limits(
    lower: list[float] | None, upper: list[float] | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """(lower, upper) as arrays, None for the sim arm's stops; ValueError unless both are
    given (or neither), of one length, finite, with lower < upper."""
    if lower is None and upper is None:
        return None
    if lower is None or upper is None or len(lower) != len(upper) or not lower:
        raise ValueError("DotFollower: lower and upper go together, one value per joint each")
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    if not (np.isfinite(lo).all() and np.isfinite(hi).all() and (lo < hi).all()):
        raise ValueError("DotFollower: lower and upper must be finite, with lower < upper")
    return lo, hi


def _frozen(
    prefix: np.ndarray, dim: int, delay: int, pose: np.ndarray | None
) -> np.ndarray | None:
    """The rows an rtc answer must keep: the prefix, then its last row (or, without one, the
    pose) repeated up to `delay` rows; None when there is nothing to keep."""
    if prefix.ndim == 2 and prefix.shape[0] > 0 and prefix.shape[1] == dim:
        last = prefix[-1]
    elif pose is not None and pose.shape == (dim,) and delay > 0:
        prefix, last = np.empty((0, dim)), pose
    else:
        return None
    hold = max(0, delay - prefix.shape[0])
    return np.concatenate([prefix, np.tile(last, (hold, 1))]) if hold else prefix


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
