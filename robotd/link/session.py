"""The policy side of the main process: turns the control lane's asks into chunks.

The control lane publishes every step's record and, when its queue runs low, an
ask naming the step. Here each ask becomes an act: the window the policy declared
is planned (robotd.link.windows); with an observe connection (robotd.link.uplink) the
act names its steps, which went up ahead of it, and what the worker still lacks goes
inline on a second try; without one, the window's steps are resolved from the step
ring and the shared-memory frame rings and sent inline. The chunk goes back down to
the control lane, named by the ask it answers. Nothing here runs on the control lane.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from robotd.contract import Actions, Observations
from robotd.link.client import ActResult, PolicyClient, PolicyError
from robotd.link.windows import Window, WindowPlanner, assemble
from robotd.reservoir import Reservoir
from robotd.shm import FrameRing

if TYPE_CHECKING:
    from robotd.link.uplink import Uplink

log = logging.getLogger("robotd.link")

UPLOAD_COUNTERS = (
    "uploaded_frames",
    "uploaded_bytes",
    "inline_frames",
    "skipped_frames",
    "refused_frames",
)
# Error codes after which the worker handed the act to the policy (it released old steps).
_DISPATCHED = ("policy_error", "bad_actions", "bad_frame")
TIMING_SAMPLE = 10_000  # act round trips kept for percentiles (a uniform sample of the run)


class FrameLost(Exception):
    """A frame a window needs was overwritten in its ring before it was read."""


@dataclass
class LinkCounters:
    """The policy link's counters. Frames: camera frames (skipped = declared lost robot-side
    or given up when behind; refused = the worker would not keep them); bytes: uploads as
    sent (messages, frames and values). `rtt_ms`: each act's round trip from its ask to its
    chunk, `infer_ms`: the policy's time; both bounded uniform samples of the run."""

    acts: int = 0
    act_errors: int = 0
    skipped_frames: int = 0
    uploaded_frames: int = 0
    uploaded_bytes: int = 0
    inline_frames: int = 0
    refused_frames: int = 0
    rtt_ms: Reservoir = field(default_factory=lambda: Reservoir(TIMING_SAMPLE))
    infer_ms: Reservoir = field(default_factory=lambda: Reservoir(TIMING_SAMPLE, seed=1))

    def uploads(self) -> dict[str, int]:
        """The upload counters of the summary and telemetry."""
        return {name: getattr(self, name) for name in UPLOAD_COUNTERS}


def step_value(rec: dict[str, Any], key: str) -> np.ndarray:
    """A non-camera key's value in a step record (the control lane's "step" message)."""
    if key == "joints.pos":
        return np.asarray(rec["pos"], dtype=np.float64)
    if key == "joints.vel":
        return np.asarray(rec["vel"], dtype=np.float64)
    raise KeyError(f"unknown observation key {key!r}")


class StepRing:
    """The recent steps of the present worker-side episode, by step number.

    Keeps `keep` steps back from the newest; a new episode id empties it, so a
    window can never read another episode's steps.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.wep = ""
        self._steps: dict[int, dict[str, Any]] = {}
        self.newest = -1

    def add(self, rec: dict[str, Any]) -> None:
        if rec["wep"] != self.wep:
            self.wep = rec["wep"]
            self._steps.clear()
            self.newest = -1
        step = int(rec["s"])
        self._steps[step] = rec
        self.newest = max(self.newest, step)
        self._steps.pop(step - self.keep, None)

    def get(self, wep: str, step: int) -> dict[str, Any] | None:
        if wep != self.wep:
            return None
        return self._steps.get(step)


class FrameSource:
    """Reads frames out of the camera rings by the index a step recorded."""

    def __init__(self, rings: dict[str, FrameRing]) -> None:
        self.rings = rings

    def read(self, camera: str, ref: Any) -> np.ndarray:
        if ref is None:
            raise FrameLost(f"camera {camera!r} had no frame at that step")
        got = self.rings[camera].read(int(ref[0]))
        if got is None:
            raise FrameLost(
                f"camera {camera!r} frame {int(ref[0])} was overwritten before it was read"
            )
        return got[0]


def choose_contract(
    worker: Observations | None, configured: Observations | None
) -> Observations | None:
    """The worker's declared contract wins; the config's serves servers that cannot declare."""
    if worker is not None and configured is not None:
        from robotd.contract import differences

        diff = differences(configured, worker)
        if diff:
            log.warning(
                "the config's observation contract differs from the worker's (the worker's "
                "is used): %s",
                "; ".join(diff),
            )
    return worker if worker is not None else configured


def resample(rows: np.ndarray, from_hz: float, to_hz: float) -> np.ndarray:
    """Rows played at from_hz, linearly resampled to the control rate (row 0 stays row 0)."""
    if abs(from_hz - to_hz) < 1e-9 or rows.shape[0] < 2:
        return rows
    t_src = np.arange(rows.shape[0]) / from_hz
    n = int(np.floor(t_src[-1] * to_hz + 1e-9)) + 1
    t_dst = np.arange(n) / to_hz
    return np.stack([np.interp(t_dst, t_src, rows[:, d]) for d in range(rows.shape[1])], axis=1)


@dataclass(slots=True)
class _Ask:
    id: int
    wep: str
    step: int
    window: Window
    prev: int | None  # the act before it (restored if this one never reaches the policy)
    asked: float  # perf_counter when the ask was taken up
    inputs: dict[str, list[Any]] | None = None  # assembled here when sent inline


class ActLink:
    """Answers asks: plan the window, get it to the worker, act, send the chunk down.

    With `uplink`, the act names its window (uploaded ahead) and waits on the worker at
    most `stream_wait_s` for what has not arrived; without, the window goes inline.
    """

    def __init__(
        self,
        client: PolicyClient,
        planner: WindowPlanner,
        steps: StepRing,
        frames: FrameSource,
        send_down: Callable[[dict[str, Any]], None],
        *,
        control_hz: float,
        actions: Actions | None,
        camera_names: set[str],
        uplink: Uplink | None = None,
        stream_wait_s: float = 10.0,
        counters: LinkCounters | None = None,
    ) -> None:
        self.client = client
        self.planner = planner
        self.steps = steps
        self.frames = frames
        self.send_down = send_down
        self.control_hz = control_hz
        self.actions = actions
        self.cameras = camera_names
        self.uplink = uplink
        self.stream_wait_s = stream_wait_s
        self.counters = counters or LinkCounters()
        self._prev_act: dict[str, int] = {}

    def _lookup(self, wep: str) -> Callable[[int, str], Any]:
        def lookup(step: int, key: str) -> Any:
            rec = self.steps.get(wep, step)
            if rec is None:
                raise FrameLost(f"step {step} of episode {wep} is no longer held")
            if key in self.cameras:
                return self.frames.read(key, rec["cams"].get(key))
            return step_value(rec, key)

        return lookup

    def window(self, wep: str, step: int) -> Window:
        return self.planner.plan(step, self._prev_act.get(wep))

    def begin(self, ask: dict[str, Any]) -> _Ask | None:
        """The part of an ask done at once, in message order: plan the window and tell the
        uplink (or read the window out of the rings). None if it failed (reported)."""
        wep, step, ask_id = str(ask["wep"]), int(ask["s"]), int(ask["id"])
        prev = self._prev_act.get(wep)
        try:
            a = _Ask(ask_id, wep, step, self.planner.plan(step, prev), prev, time.perf_counter())
        except ValueError as exc:  # an ask not after the previous one: never act on it
            self._fail(ask_id, f"cannot plan the window: {exc}")
            return None
        self._prev_act[wep] = step  # (taken back in _settle if the act never reaches it)
        try:
            if self.uplink is not None:
                self.uplink.on_ask(wep, step, int(ask.get("queue", 0)))
                self.uplink.ensure(wep, a.window.needed())
            else:
                a.inputs = assemble(a.window, self._lookup(wep))
            return a
        except FrameLost as exc:
            self.counters.skipped_frames += 1
            reason = f"window incomplete: {exc}"
        except Exception as exc:  # a bug must not leave the ask unanswered
            log.exception("ask %d at step %d: cannot prepare the act", ask_id, step)
            reason = f"cannot prepare the act: {type(exc).__name__}: {exc}"
        self._settle(a, handed=False)
        self._fail(ask_id, reason)
        return None

    async def finish(self, a: _Ask) -> None:
        """Act and send the chunk (or act_failed) down. Never raises: every failure becomes
        act_failed, an unexpected one logged with its traceback."""
        handed = False
        try:
            result = await self._act(a)
            handed = True
            rows = result.actions.astype(np.float64, copy=False)
            if self.actions is not None and self.actions.hz:
                rows = resample(rows, self.actions.hz, self.control_hz)
        except FrameLost as exc:
            reason = f"window incomplete: {exc}"
        except PolicyError as exc:
            handed = exc.code in _DISPATCHED
            reason = f"act failed: PolicyError: {exc}"
        except (TimeoutError, OSError) as exc:
            reason = f"act failed: {type(exc).__name__}: {exc}"
        except Exception as exc:
            log.exception("ask %d at step %d: the act failed", a.id, a.step)
            reason = f"act failed: {type(exc).__name__}: {exc}"
        else:
            reason = None
        self._settle(a, handed)
        if reason is not None:
            self._fail(a.id, reason)
            return
        self.counters.acts += 1
        self.counters.rtt_ms.add((time.perf_counter() - a.asked) * 1e3)
        self.counters.infer_ms.add(result.infer_ms)
        self.send_down({"k": "chunk", "ask": a.id, "wep": a.wep, "s": a.step, "rows": rows})

    async def on_ask(self, ask: dict[str, Any]) -> None:
        a = self.begin(ask)
        if a is not None:
            await self.finish(a)

    async def _act(self, a: _Ask) -> ActResult:
        if a.inputs is not None:
            return await self.client.act(
                a.wep, a.step, list(a.inputs["steps"]), a.inputs["observations"]
            )
        return await self._act_named(a)

    def _settle(self, a: _Ask, handed: bool) -> None:
        """The act is over. If it never reached the policy, the next act's window counts
        from the act before it (the policy never saw this one's steps)."""
        if not handed and self._prev_act.get(a.wep) == a.step:
            if a.prev is None:
                self._prev_act.pop(a.wep, None)
            else:
                self._prev_act[a.wep] = a.prev
        if self.uplink is not None:
            self.uplink.settled(a.wep, a.step, handed)

    async def _act_named(self, a: _Ask) -> ActResult:
        """The act naming its steps; once more with the missing ones inline if the worker
        lacks some (FrameLost if those are gone robot-side too)."""
        assert self.uplink is not None
        steps = list(a.window.steps)
        reads = [list(a.window.keys_at[s]) for s in steps]
        below = self.uplink.release_point(a.step)
        timeout = self.client.timeout_s + self.stream_wait_s
        inline: list[dict[str, Any]] | None = None
        try:
            for attempt in (1, 2):
                try:
                    result = await self.client.act_steps(
                        a.wep,
                        a.step,
                        steps,
                        reads,
                        inline=inline,
                        release_below=below,
                        wait_s=self.stream_wait_s,
                        timeout_s=timeout,
                    )
                    break
                except PolicyError as exc:
                    if exc.code != "missing_steps" or attempt == 2:
                        raise
                    missing = exc.missing(a.window.needed())
                    log.warning(
                        "act at step %d: the worker lacks %d uploads (%s); sending them inline",
                        a.step,
                        len(missing),
                        exc.message,
                    )
                    inline = await self.uplink.inline(a.wep, [(s, k) for s, k, _ in missing])
        except PolicyError as exc:
            if exc.code in _DISPATCHED:
                self.uplink.released(a.wep, below)
            raise
        self.uplink.released(a.wep, below)
        return result

    def _fail(self, ask_id: int, reason: str) -> None:
        self.counters.act_errors += 1
        log.warning("ask %d: %s", ask_id, reason)
        self.send_down({"k": "act_failed", "ask": ask_id, "reason": reason})

    def forget(self, wep: str) -> None:
        self._prev_act.pop(wep, None)
        if self.uplink is not None:
            self.uplink.end(wep)
