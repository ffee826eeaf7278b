"""Policies for the answer tests (tests/test_answers_*.py), importable by a worker's copies
(tests/ is on their PYTHONPATH). Named test_answers_* only because that is where the
answer tests live; it holds no test."""

from __future__ import annotations

from typing import Any

import numpy as np

from robotd.contract import Actions, Observations, Stream

WIDE = (16, 3_000_000)  # 384 MB of float64: far more columns than any robot has joints


class Shaped:
    """No contract: handed the act's own observation, answers what its `answer` names (a
    good (1, 3) float row otherwise). `steps` answers one row holding Episode.steps."""

    def infer(self, obs: dict[str, Any], *, episode: Any = None) -> Any:
        kind = obs.get("answer")
        if kind == "wide":
            return np.zeros(WIDE)
        if kind == "tall":
            return np.zeros((5000, 3))
        if kind == "bool":
            return np.ones((16, 3), dtype=bool)
        if kind == "int":
            return np.zeros((16, 3), dtype=np.int64)
        if kind == "uint8":
            return np.zeros((16, 3), dtype=np.uint8)
        if kind == "int_list":
            return [[0, 1, 0], [1, 0, 1]]
        if kind == "bool_list":
            return [[True, False, True]]
        if kind == "raise_long":
            raise ValueError("x" * 10_000_000)  # its text must not travel whole
        if kind == "raise":
            raise RuntimeError("asked to fail")
        if kind == "steps":
            return [[float(episode.steps)] * 3]
        return np.zeros((1, 3), dtype=np.float32)


class Wide:
    """What the walkthrough's policy did: reads joints.pos, answers 16 rows of 3,000,000
    columns every act."""

    observations = Observations(streams={"joints.pos": Stream()})
    actions = Actions(open_loop_horizon=8)

    def infer(self, inputs: dict[str, Any]) -> np.ndarray:
        return np.zeros(WIDE)


class Masked:
    """Reads joints.pos, answers a bool mask of the robot's shape (16 x 3) every act."""

    observations = Observations(streams={"joints.pos": Stream()})
    actions = Actions(open_loop_horizon=8)

    def infer(self, inputs: dict[str, Any]) -> np.ndarray:
        return np.ones((16, 3), dtype=bool)


class Absurd:
    """Reads joints.pos. Every other act (Episode.steps odd) answers 32 rows whose elbow
    (column 1) is 1e6 rad from row 2 on, on a joint limited to +-2.8: finite, so the worker
    sends it, but no target; the other acts answer 32 rows holding where the arm is."""

    observations = Observations(streams={"joints.pos": Stream()})
    actions = Actions(open_loop_horizon=8)

    def infer(self, inputs: dict[str, Any], *, episode: Any = None) -> np.ndarray:
        pos = np.asarray(inputs["observations"][-1]["joints.pos"], dtype=np.float64)
        rows = np.tile(pos, (32, 1))
        if episode.steps % 2 == 1:
            rows[2:, 1] = 1e6
        return rows
