"""The whole path of observation windows and their upload ahead: the sim robot, the real
daemon, its local worker process, and a test policy that records what it was handed:
exactly the declared steps and keys, frames fitted and decoded as declared, uploaded ahead
of the acts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from robotd.contract import Observations
from robotd.link.windows import WindowPlanner
from tests.daemon_util import REPO, Daemon

HZ = 30.0
KEYS = ["top", "wrist", "joints.pos", "joints.vel"]  # config/sim.toml's cameras, then joints

POLICY = textwrap.dedent("""
    import json
    import os

    import numpy as np

    from robotd.contract import Actions, Camera, Observations, Stream

    CONTRACT = {
        "streams": {
            "top": {"at": [-10, -5, 0], "camera": {"width": 64, "height": 48,
                                                    "codec": "jpeg", "layout": "chw_float"}},
            "wrist": {"every": 2, "camera": {"width": 32, "height": 24, "resize": "crop",
                                             "codec": "png"}},
            "joints.pos": {},
        },
    }

    def describe(value):
        a = np.asarray(value)
        return {"shape": list(a.shape), "dtype": str(a.dtype), "min": float(a.min()),
                "max": float(a.max()), "sum": float(a.astype(np.float64).sum())}

    class Recorder:
        observations = Observations.from_wire(CONTRACT)
        actions = Actions(open_loop_horizon=4)

        def __init__(self, **args):  # the sim config passes the demo's arguments
            pass

        def infer(self, inputs, *, episode=None):
            record = {"episode": episode, "steps": inputs["steps"],
                      "observations": [{k: describe(v) for k, v in o.items()}
                                       for o in inputs["observations"]]}
            with open(os.environ["ROBOTD_TEST_RECORD"], "a") as out:
                out.write(json.dumps(record) + "\\n")
            q = np.asarray(inputs["observations"][-1]["joints.pos"], dtype=np.float64)
            return np.tile(q, (8, 1))  # hold the pose
""")
CONTRACT = {
    "streams": {
        "top": {
            "at": [-10, -5, 0],
            "camera": {"width": 64, "height": 48, "codec": "jpeg", "layout": "chw_float"},
        },
        "wrist": {
            "every": 2,
            "camera": {"width": 32, "height": 24, "resize": "crop", "codec": "png"},
        },
        "joints.pos": {},
    },
}


def run_daemon(
    tmp_path: Path, timing: str, *overrides: str
) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    (tmp_path / "recpolicy.py").write_text(POLICY)
    record = tmp_path / "record.jsonl"
    env = {
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "ROBOTD_TEST_RECORD": str(record),
    }
    d = Daemon(
        tmp_path,
        "--duration",
        "3",
        "--set",
        'policy.serve="recpolicy:Recorder"',
        "--set",
        f'control.timing="{timing}"',
        "--set",
        "control.refill_steps=3",
        *(arg for o in overrides for arg in ("--set", o)),
        env=env,
    )
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    acts = [json.loads(line) for line in record.read_text().splitlines()]
    return acts, d.result(), d.log


@pytest.mark.parametrize("timing", ["sync", "realtime"])
def test_the_policy_reads_exactly_its_declared_windows_uploaded_ahead(
    tmp_path: Path, timing: str
) -> None:
    acts, summary, _ = run_daemon(tmp_path, timing)
    check_windows(acts, summary)


def test_a_worker_with_its_policy_inline_reads_the_same_windows(tmp_path: Path) -> None:
    """`robotd serve --inline` (the policy called in the worker's poll loop): the uploaded
    frames are decoded in the loop and the policy reads exactly what a copy would."""
    (tmp_path / "recpolicy.py").write_text(POLICY)
    record = tmp_path / "record.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "ROBOTD_TEST_RECORD": str(record),
    }
    endpoint = f"ipc://{tmp_path}/w.sock"
    argv = [sys.executable, "-m", "robotd", "serve", "recpolicy:Recorder", "--inline"]
    with (tmp_path / "worker.log").open("w") as log:
        worker = subprocess.Popen(
            [*argv, "--bind", endpoint], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        d = Daemon(tmp_path, "--worker", endpoint, "--duration", "3", "--set",
                   'control.timing="realtime"', "--set", "control.refill_steps=3")  # fmt: skip
        assert d.wait_exit() == 0, "".join(d.log[-30:])
        acts = [json.loads(line) for line in record.read_text().splitlines()]
        assert d.result()["act_errors"] == 0, "".join(d.log[-30:])
        check_windows(acts, d.result())
        assert worker.poll() is None  # it serves on after the daemon's episode
    finally:
        worker.terminate()
        assert worker.wait(30) == 0, (tmp_path / "worker.log").read_text()


def check_windows(acts: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """Each act read exactly its planned window, every frame uploaded ahead."""
    assert len(acts) >= 8 and summary["act_errors"] == 0
    assert len({a["episode"] for a in acts}) == 1
    planner = WindowPlanner(Observations.from_wire(CONTRACT).resolve(HZ), KEYS)
    prev = None
    seen: dict[tuple[int, str], dict[str, Any]] = {}
    for act in acts:
        t = act["steps"][-1]
        window = planner.plan(t, prev)
        assert act["steps"] == list(window.steps)
        assert [sorted(o) for o in act["observations"]] == [
            sorted(window.keys_at[s]) for s in window.steps
        ]
        for step, obs in zip(act["steps"], act["observations"]):
            for key, value in obs.items():
                # The same step reads the same value in every act (kept once, never mixed).
                assert seen.setdefault((max(step, 0), key), value) == value
        prev = t
    top = [o["top"] for a in acts for o in a["observations"] if "top" in o]
    wrist = [o["wrist"] for a in acts for o in a["observations"] if "wrist" in o]
    assert all(v["shape"] == [3, 48, 64] and v["dtype"] == "float32" for v in top)
    assert all(0.0 <= v["min"] <= v["max"] <= 1.0 for v in top)
    assert all(v["shape"] == [24, 32, 3] and v["dtype"] == "uint8" for v in wrist)
    read_frames = {(s, k) for s, k in seen if k in ("top", "wrist")}
    # Everything read went up ahead (nothing inline, nothing lost); what went up beyond it
    # is at most the window of the act the stop came before.
    assert summary["inline_frames"] == 0 and summary["skipped_frames"] == 0
    assert summary["refused_frames"] == 0
    assert len(read_frames) <= summary["uploaded_frames"] <= len(read_frames) + 8
    assert summary["uploaded_bytes"] > 0


def test_a_window_over_the_frame_limit_goes_up_with_each_act_without_stalling(
    tmp_path: Path,
) -> None:
    """A window of 5 frames (top at 3 steps, wrist at 2) and a 4-frame limit: nothing runs
    ahead, but each act's frames go up when it is asked; no act waits out stream_wait_s."""
    acts, summary, log = run_daemon(
        tmp_path, "sync", "policy.max_episode_frames=4", "policy.stream_wait_s=1"
    )
    assert len(acts) >= 8 and summary["act_errors"] == 0
    assert summary["inline_frames"] == 0 and summary["skipped_frames"] == 0
    warning = "".join(line for line in log if "camera frames" in line)
    assert "reads 5 camera frames" in warning and "only 4 frames per episode" in warning
