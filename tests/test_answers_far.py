"""Finite rows no joint could mean (1e6 rad on a joint limited to +-2.8) are a worker's
nonsense, not a motion to stop: the chunk check refuses the act naming the row, the joint
and its limits, and the robot holds (or plays what it has queued) instead of the shield
rejecting row after row into FAULT. Values merely a bit outside the limits are still the
shield's to clip. The daemon and its local worker are real processes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from robotd.config import load_config
from robotd.link.chunks import ChunkLimits, ChunkRefused, prepare
from tests.copy_util import ROOT, TESTS
from tests.daemon_util import Daemon


def _limits(mode: str = "absolute") -> ChunkLimits:
    # the embedded sim arm: shoulder, elbow in -2.8..2.8, gripper in 0..1
    return ChunkLimits.for_robot(load_config(None, [f'control.control_mode="{mode}"']))


def _refused(rows: list[list[float]], mode: str = "absolute") -> str:
    with pytest.raises(ChunkRefused) as refused:
        prepare(np.array(rows), None, 30.0, _limits(mode))
    return str(refused.value)


@pytest.mark.parametrize("value", [1e30, -1e6, 8.5, -8.5])
def test_a_value_more_than_a_span_outside_the_limits_is_refused(value: float) -> None:
    said = _refused([[0.0, 0.0, 0.5], [0.0, value, 0.5]])
    assert said.startswith(f"row 1, joint 'elbow': {value:g} is far outside its limits ")
    assert "-2.8..2.8 (more than their span, 5.6, beyond them)" in said


@pytest.mark.parametrize("value", [2.85, 8.3, -8.3])
def test_a_value_within_a_span_outside_is_left_to_the_shield(value: float) -> None:
    rows = prepare(np.array([[0.0, value, 0.5]]), None, 30.0, _limits())
    assert rows[0, 1] == value  # handed down as it came: the shield clips or rejects it


def test_a_gripper_is_a_target_in_every_mode() -> None:
    said = _refused([[0.0, 0.0, 2.5]], "delta")
    assert said == (
        "row 0, joint 'gripper': 2.5 is far outside its limits 0..1 (more than their span, "
        "1, beyond them)"
    )


@pytest.mark.parametrize(
    ("mode", "ok", "far", "words"),
    [
        (
            "delta",
            11.0,
            11.5,
            "a delta of 11.5 takes it far outside its limits -2.8..2.8 "
            "wherever it stands (control_mode delta: at most ±11.2)",
        ),
        (
            "velocity",
            330.0,
            340.0,
            "a velocity of 340 units/s takes it far outside its limits "
            "-2.8..2.8 wherever it stands (control_mode velocity: at most ±336 units/s)",
        ),
    ],
)
def test_a_step_that_leaves_the_limits_far_behind_wherever_the_joint_is_is_refused(
    mode: str, ok: float, far: float, words: str
) -> None:
    """A step is far when even from the far limit it lands over a span beyond the near
    one: more than twice the span (per tick; velocity in units/s at 30 Hz)."""
    prepare(np.array([[ok, -ok, 0.5]]), None, 30.0, _limits(mode))
    assert _refused([[0.0, far, 0.5]], mode) == f"row 0, joint 'elbow': {words}"


def test_the_row_named_is_the_policys_own_before_resampling() -> None:
    from robotd.contract import Actions

    rows = np.zeros((4, 3))
    rows[3, 0] = 1e9
    with pytest.raises(ChunkRefused, match=r"^row 3, joint 'shoulder': 1e\+09 is far"):
        prepare(rows, Actions(hz=10.0), 30.0, _limits())


def test_the_robot_holds_through_absurd_answers_and_plays_the_good_ones(tmp_path: Path) -> None:
    """Every other act answers 30 rows of 1e6 rad on the elbow. Before the chunk check
    refused them they went down, the shield rejected five in a row and latched FAULT; now
    each such act fails (counted, logged naming the row, the joint and its limits), the
    robot holds or plays its queue, and the next act's good chunk plays: one episode on,
    nothing rejected."""
    path = os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    d = Daemon(
        tmp_path,
        "--set", 'policy.serve="test_answers_policies:Absurd"',
        "--set", "policy.args={}",
        "--set", "cameras={}",
        env={"PYTHONPATH": path},
    )  # fmt: skip
    said = (
        r"robotd\.link: ask \d+: chunk refused: row 2, joint 'elbow': 1e\+06 is far outside "
        r"its limits -2\.8\.\.2\.8 \(more than their span, 5\.6, beyond them\)"
    )
    for _ in range(3):  # a good act's chunk comes between any two of them
        d.wait_line(said, timeout=90)
    d.signal()
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    s = d.result()
    assert s["state"] == "RUNNING" and s["rejected"] == 0, s
    assert s["episodes"] == 1 and s["episode_resets"] == 0, s
    assert s["act_failures"] >= 3 and s["act_errors"] >= 3, s
    assert s["chunks"] >= 3, s  # the first act's, then one after each refusal but the last
    assert not any("FAULT" in line or "rejected actions" in line for line in d.log)
