"""A policy whose answer is what the act's observation asks for (`answer`), for the tests
of refused answers (tests/test_serve_refused.py); importable by a copy process."""

from __future__ import annotations

import numpy as np


class Answers:
    """No contract: handed the act's own observation; answers one good row unless asked."""

    def infer(self, obs: dict):
        kind = obs.get("answer")
        if kind == "nan":
            return [[float("nan"), 1.0]]
        if kind == "none":
            return None
        if kind == "str":
            return "left"
        if kind == "flat":
            return np.zeros(3)
        return [[1.0, 2.0]]
