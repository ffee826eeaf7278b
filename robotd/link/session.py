"""The policy side of the main process: turns the control lane's asks into chunks.

The control lane publishes every step's record and, when its queue runs low, an
ask naming the step. Here each ask becomes an act: the window the policy declared
is planned (robotd.link.windows), its steps are resolved from the step ring and the
shared-memory frame rings, the worker answers, and the chunk goes back down to the
control lane, named by the ask it answers. Nothing here runs on the control lane.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from robotd.contract import Actions, Observations
from robotd.link.client import PolicyClient, PolicyError
from robotd.link.windows import Window, WindowPlanner, assemble
from robotd.shm import FrameRing

log = logging.getLogger("robotd.link")


class FrameLost(Exception):
    """A frame a window needs was overwritten in its ring before it was read."""


@dataclass
class LinkCounters:
    acts: int = 0
    act_errors: int = 0
    skipped_frames: int = 0
    rtt_ms: list[float] | None = None
    infer_ms: list[float] | None = None

    def __post_init__(self) -> None:
        self.rtt_ms = []
        self.infer_ms = []


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


class ActLink:
    """Answers asks: plan the window, resolve it, act, send the chunk down."""

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
    ) -> None:
        self.client = client
        self.planner = planner
        self.steps = steps
        self.frames = frames
        self.send_down = send_down
        self.control_hz = control_hz
        self.actions = actions
        self.cameras = camera_names
        self.counters = LinkCounters()
        self._prev_act: dict[str, int] = {}

    def _lookup(self, wep: str) -> Callable[[int, str], Any]:
        def lookup(step: int, key: str) -> Any:
            rec = self.steps.get(wep, step)
            if rec is None:
                raise FrameLost(f"step {step} of episode {wep} is no longer held")
            if key in self.cameras:
                return self.frames.read(key, rec["cams"].get(key))
            if key == "joints.pos":
                return np.asarray(rec["pos"], dtype=np.float64)
            if key == "joints.vel":
                return np.asarray(rec["vel"], dtype=np.float64)
            raise KeyError(f"unknown observation key {key!r}")

        return lookup

    def window(self, wep: str, step: int) -> Window:
        return self.planner.plan(step, self._prev_act.get(wep))

    async def on_ask(self, ask: dict[str, Any]) -> None:
        wep, step, ask_id = str(ask["wep"]), int(ask["s"]), int(ask["id"])
        try:
            window = self.window(wep, step)
            inputs = assemble(window, self._lookup(wep))
            self._prev_act[wep] = step
            result = await self.client.act(wep, step, list(inputs["steps"]), inputs["observations"])
        except FrameLost as exc:
            self.counters.skipped_frames += 1
            self._fail(ask_id, f"window incomplete: {exc}")
            return
        except (PolicyError, TimeoutError, OSError) as exc:
            self._fail(ask_id, f"act failed: {type(exc).__name__}: {exc}")
            return
        rows = result.actions.astype(np.float64, copy=False)
        if self.actions is not None and self.actions.hz:
            rows = resample(rows, self.actions.hz, self.control_hz)
        self.counters.acts += 1
        self.counters.rtt_ms.append(result.rtt_ms)
        self.counters.infer_ms.append(result.infer_ms)
        self.send_down({"k": "chunk", "ask": ask_id, "wep": wep, "s": step, "rows": rows})

    def _fail(self, ask_id: int, reason: str) -> None:
        self.counters.act_errors += 1
        log.warning("ask %d: %s", ask_id, reason)
        self.send_down({"k": "act_failed", "ask": ask_id, "reason": reason})

    def forget(self, wep: str) -> None:
        self._prev_act.pop(wep, None)
