"""An exercise policy: each joint swings slowly around where the episode found it, within
its limits. What a real arm's config serves when no worker is named, so that clear_fault +
start gives a whole episode on a bench (or on the emulator)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from robotd.contract import Actions, Observations, Stream


class Wave:
    """Rows for steps t … t + horizon − 1 of an act at step t.

    Joint j moves by A_j · sin(2π (s − s0) / (period_j · hz)) around its pose at the
    episode's first act (step s0), so the first row is where the arm already is (moved inside
    the limits, when given, if the reading was past one). A_j is
    `amplitude`, shrunk so that the swing stays `margin` inside [lower_j, upper_j] when the
    limits are given; period_j grows by 15 % a joint so the joints do not move in step.
    """

    observations = Observations(streams={"joints.pos": Stream()})
    actions = Actions(hz=30.0, open_loop_horizon=8)

    def __init__(
        self,
        lower: list[float] | None = None,
        upper: list[float] | None = None,
        amplitude: float = 0.3,
        period_s: float = 6.0,
        hz: float = 30.0,
        horizon: int = 16,
        margin: float = 0.05,
    ) -> None:
        if not (amplitude >= 0 and period_s > 0 and hz > 0 and horizon >= 1 and margin >= 0):
            raise ValueError(
                "Wave: need amplitude >= 0, period_s > 0, hz > 0, horizon >= 1, margin >= 0"
            )
        if (lower is None) != (upper is None) or (
            lower is not None and upper is not None and len(lower) != len(upper)
        ):
            raise ValueError("Wave: lower and upper go together, one value per joint each")
        self.lower = None if lower is None else np.asarray(lower, dtype=np.float64)
        self.upper = None if upper is None else np.asarray(upper, dtype=np.float64)
        self.amplitude, self.period_s, self.hz = float(amplitude), float(period_s), float(hz)
        self.horizon, self.margin = int(horizon), float(margin)
        self.actions = Actions(hz=self.hz, open_loop_horizon=min(8, self.horizon))
        self._home: np.ndarray | None = None
        self._s0 = 0
        self._episode: str | None = None

    def reset(self) -> None:
        self._home = None

    def infer(self, inputs: dict[str, Any], *, episode: str | None = None) -> np.ndarray:
        observations = inputs.get("observations") if isinstance(inputs, dict) else None
        steps = inputs.get("steps") if isinstance(inputs, dict) else None
        now = observations[-1] if observations else inputs
        if not isinstance(now, dict) or "joints.pos" not in now:
            raise ValueError("Wave: the act's observation has no 'joints.pos'")
        q = np.asarray(now["joints.pos"], dtype=np.float64).reshape(-1)
        t = int(steps[-1]) if steps else 0
        limited = self.lower is not None and self.upper is not None and self.lower.shape == q.shape
        if self._home is None or episode != self._episode or self._home.shape != q.shape:
            # A joint resting at its stop reads a little past it half the time (read noise):
            # home inside the limits, or the shield would clip every row of the episode.
            home = np.clip(q, self.lower, self.upper) if limited else q.copy()
            self._home, self._s0, self._episode = home, t, episode
        home = self._home
        amp = np.full(q.shape, self.amplitude)
        if limited:
            room = np.minimum(home - self.lower, self.upper - home) - self.margin
            amp = np.clip(np.minimum(amp, room), 0.0, None)
        periods = self.period_s * (1 + 0.15 * np.arange(q.size)) * self.hz
        s = np.arange(t, t + self.horizon)[:, None] - self._s0
        return home + amp * np.sin(2 * math.pi * s / periods)
