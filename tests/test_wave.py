"""Wave, the exercise policy real arms' configs serve: it starts where the arm is and never
asks for a position past the limits it was given, even when a joint's reading is."""

from __future__ import annotations

import numpy as np

from robotd.worker.wave import Wave

LOWER = [-1.9, -1.7, 0.0]
UPPER = [1.9, 1.7, 1.0]


def _act(policy: Wave, q: list[float], step: int, episode: str = "e-1") -> np.ndarray:
    return policy.infer({"observations": [{"joints.pos": q}], "steps": [step]}, episode=episode)


def test_a_gripper_read_just_past_its_stop_is_held_at_the_stop_not_past_it() -> None:
    # A gripper resting on its 0.0 stop reads -0.0004 (read noise): every row of the episode
    # would be past the limit, and the shield would clip them all.
    policy = Wave(lower=LOWER, upper=UPPER)
    for step in (0, 8, 16, 400):
        rows = _act(policy, [0.2, -0.3, -0.0004], step)
        assert (rows >= np.array(LOWER)).all() and (rows <= np.array(UPPER)).all(), rows
        assert (rows[:, 2] == 0.0).all()  # no room to swing at the stop: held there


def test_the_first_row_is_where_the_arm_is_when_it_is_within_its_limits() -> None:
    policy = Wave(lower=LOWER, upper=UPPER)
    rows = _act(policy, [0.2, -0.3, 0.5], 0)
    np.testing.assert_allclose(rows[0], [0.2, -0.3, 0.5])
    assert np.abs(np.diff(rows, axis=0)).max() > 0  # it does swing


def test_without_limits_the_reading_is_home_as_read() -> None:
    rows = _act(Wave(), [0.2, -0.3, -0.0004], 0)
    np.testing.assert_allclose(rows[0], [0.2, -0.3, -0.0004])
