"""Policies for the fault tests (tests/test_faults.py), importable by the worker's copies
(tests/ is on their PYTHONPATH). `Recorder` appends one JSON line per act to `path` (what
it was handed) and misbehaves once when a flag file names a fault in `flags`."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from robotd.contract import Actions, Observations, Stream

LOOKBACK = 3


class Recorder:
    """Reads joints.pos at [-3, 0]; answers 16 rows that ease from the present pose toward
    a slowly moving pose (within the sim arm's limits). Faults, each once: a file named
    `hang`, `oom`, `big` or `exit` in `flags` (the file is removed as the fault starts)."""

    observations = Observations(streams={"joints.pos": Stream(at=[-LOOKBACK, 0])})
    actions = Actions(open_loop_horizon=8)

    def __init__(self, path: str, flags: str) -> None:
        self.path = Path(path)
        self.flags = Path(flags)

    def _fault(self, name: str) -> bool:
        try:
            (self.flags / name).unlink()
        except FileNotFoundError:
            return False
        return True

    def infer(self, inputs: dict[str, Any], *, episode: Any = None) -> np.ndarray:
        steps, obs = inputs["steps"], inputs["observations"]
        pos = [o["joints.pos"].tolist() for o in obs]
        record = {"episode": str(episode), "step": steps[-1], "steps": steps, "pos": pos}
        record["pid"] = os.getpid()
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self._fault("hang"):
            threading.Event().wait()  # forever: the worker kills this copy after --hang-s
        if self._fault("oom"):
            hog = np.ones(4 << 30, dtype=np.uint8)  # past the copy's RLIMIT_AS
            return hog[:3].reshape(1, 3).astype(float)
        if self._fault("exit"):
            os._exit(3)
        if self._fault("big"):
            return np.zeros((3_000_000, 3))  # 72 MB: the daemon refuses it, the lane never sees it
        q = np.asarray(pos[-1], dtype=float)
        t = steps[-1] / 30.0
        goal = np.array([0.3 * np.sin(t), -1.0 + 0.2 * np.cos(t), 0.5])
        ease = np.linspace(0.05, 0.8, 16)[:, None]
        return q + ease * (goal - q)


class SlowRate:
    """Declares its rows at 0.0001 Hz: a contract the daemon refuses at the handshake."""

    actions = Actions(hz=1e-4)

    def __init__(self, path: str = "") -> None:
        self.path = path

    def infer(self, obs: Any) -> np.ndarray:
        return np.zeros((4, 3))


class Tunable:
    """An inference parameter, `gain`: each act appends (episode, gain) to `path`."""

    actions = Actions(open_loop_horizon=8)

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def infer(self, obs: dict[str, Any], *, episode: Any = None, gain: float = 1.0) -> np.ndarray:
        with self.path.open("a") as f:
            task = getattr(episode, "task", None)
            f.write(json.dumps({"episode": str(episode), "gain": gain, "task": task}) + "\n")
        return np.tile(np.asarray(obs["joints.pos"], dtype=float), (8, 1))
