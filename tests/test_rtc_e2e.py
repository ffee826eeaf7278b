"""Real-time chunking end to end: the real daemon (`python -m robotd run`, auto refill) and a
real worker process (`robotd serve`) with a test policy that takes the frozen prefix.

The policy's rows put the step they are meant for on the gripper, plus half a step's worth
on every other act, so the value the robot played tells which act's row it was. It reads
the joint state of every step back (an `every = 1` stream; the sim arm is made exact, so
the gripper read at step k is the target played at step k - 1) and checks every prefix it
was handed against what the robot reports it played at those steps. Its compute time
jitters (100..200 ms), so answers often come before the predicted delay is over: then only
the promise keeps the prefix's rows (the newer act's own rows for those steps differ).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.policy_util import serve_child, short_dir
from tests.test_realtime_e2e import run_daemon

PREFIX_POLICY = textwrap.dedent('''
    """Checks each frozen prefix it is handed against what the robot then played."""
    import random
    import time

    import numpy as np

    from robotd.contract import Actions, Observations, Stream
    from tests.policy_util import write_report

    SCALE = 0.004


    class PrefixChecker:
        observations = Observations(streams={"joints.pos": Stream(every=1)})
        actions = Actions(open_loop_horizon=16)

        def __init__(self, report: str, horizon: int = 16):
            self.report, self.horizon = report, horizon
            self.rng = random.Random(7)
            self.found = {"acts": 0, "prefixes": 0, "checked": 0, "mismatched": 0,
                          "delays": [], "first_mismatch": None}
            self.reset()

        def reset(self):
            self.promised = {}  # step -> the gripper value its prefix row holds
            self.read = {}  # step k -> gripper read at k (what was played at k - 1)

        def infer(self, inputs, *, episode=None, rtc=None):
            time.sleep(self.rng.uniform(0.1, 0.2))  # the policy's compute time
            steps, observations = inputs["steps"], inputs["observations"]
            for step, obs in zip(steps, observations):
                if "joints.pos" in obs:
                    self.read[step] = float(obs["joints.pos"][2])
            t = steps[-1]
            f = self.found
            f["acts"] += 1
            if rtc is not None:
                f["delays"].append(int(rtc["delay"]))
                prefix = rtc["prefix"]
                f["prefixes"] += prefix.shape[0] > 0
                for i in range(prefix.shape[0]):
                    self.promised[t + i] = float(prefix[i, 2])
            self._check()
            write_report(self.report, self.found)
            q = np.asarray(observations[-1]["joints.pos"], dtype=float)
            rows = np.tile(q, (self.horizon, 1))  # the arm joints stay where they are
            odd = (f["acts"] % 2) * 0.5
            rows[:, 2] = SCALE * (t + np.arange(self.horizon) + 1 + odd)
            return rows

        def _check(self):
            for step in sorted(self.promised):
                if step + 1 not in self.read:
                    continue
                value = self.promised.pop(step)
                if abs(self.read[step + 1] - value) < 1e-6:
                    self.found["checked"] += 1
                else:
                    self.found["mismatched"] += 1
                    if self.found["first_mismatch"] is None:
                        self.found["first_mismatch"] = [step, value, self.read[step + 1]]
''')


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    yield from short_dir("robotd-rtc-", {"prefixmod.py": PREFIX_POLICY})


def test_the_prefix_a_served_policy_is_handed_is_what_the_robot_played(workdir: Path) -> None:
    endpoint = f"ipc://{workdir}/rtc-worker.sock"
    report = workdir / "report.json"
    out = workdir / "worker.out"
    served = serve_child(
        "prefixmod:PrefixChecker", endpoint, out, args=[f"report={report}"], pythonpath=[workdir]
    )
    with served:
        summary = run_daemon(
            workdir / "run",
            'control.refill_steps="auto"',
            "cameras={}",
            "joints.options.tau_s=0.001",
            "joints.options.noise=0.0",
            worker=endpoint,
        )
    assert "listening on" in out.read_text(), out.read_text()
    found = json.loads(report.read_text())
    assert found["acts"] >= 5 and found["prefixes"] >= 4, found
    assert found["mismatched"] == 0, found
    assert found["checked"] >= 15, found
    assert max(found["delays"]) >= 3, found  # 100..200 ms at 30 Hz: delays of 3..7 steps
    assert summary["state"] == "RUNNING" and summary["act_failures"] == 0, summary
    assert summary["stale_rows_played"] == 0, summary
    assert summary["acts"] >= found["acts"] - 1, summary
    assert 0 <= summary["delay_overruns"] <= summary["chunks"], summary
