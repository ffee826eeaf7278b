"""Realtime timing end to end: the real daemon (`python -m robotd run`) and a real worker process.

(a) the demo policy answering in 150 ms through a worker started on its own (`robotd serve`):
    the robot keeps acting, the latency drop happens, nothing faults, no stale row is played;
(b) a test policy whose rows encode the step they are meant for, served by the daemon's local
    worker: it puts the encoded step on the gripper, and reads it back from the joint state
    of every step (an `every = 1` stream). The sim arm is made exact (tau 1 µs, no speed
    limit, no read noise: even a read a few µs after a late tick's write sees the whole
    move), so the gripper read at step k is the last target played before it: the one of
    step k - 1, unless an overrun skipped step k - 1 (nothing played; its record repeats the
    last). The policy itself checks that every played row was meant for the step that
    played it, and writes what it found, with the steps it judged stale, to a report file;
    a step it calls stale must be one the trace marks skipped. The trace's own /robot/tick
    records are checked too: every target written was meant for its step. The naive
    baseline (control.aligned = false) must show stale rows in that report and in the
    daemon's stale_rows_played, or the check proves nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from robotd.trace.reader import read_all
from tests.policy_util import ROOT, serve_child, short_dir

# Counted from serving. Tracking is judged by the summary's played_mean (from the first
# played row on): its mean counts the first chunk's wait, which a loaded machine stretches.
DURATION_S = 3.0

STEP_POLICY = textwrap.dedent('''
    """Rows encode the step they are meant for on the gripper; checks what was played."""
    import time

    import numpy as np

    from robotd.contract import Actions, Observations, Stream
    from tests.policy_util import write_report

    SCALE = 0.004  # gripper value of a row meant for step m: SCALE * (m + 1); 0 is "no row"


    class StepEncoder:
        observations = Observations(streams={"joints.pos": Stream(every=1)})
        actions = Actions(open_loop_horizon=30)

        def __init__(self, report: str, latency_ms: float = 0.0, horizon: int = 30):
            self.report, self.latency_s, self.horizon = report, latency_ms / 1e3, horizon
            self.found = {"checked": 0, "holds": 0, "stale": 0, "ahead": 0, "episodes": 0,
                          "last_step": -1, "stale_at": []}
            self.last = None

        def reset(self):
            self.found["episodes"] += 1
            self.last = None

        def infer(self, inputs, *, episode=None):
            time.sleep(self.latency_s)  # the policy's compute time
            steps, observations = inputs["steps"], inputs["observations"]
            for step, obs in zip(steps, observations):
                if step >= 1 and "joints.pos" in obs:
                    self._check(step - 1, float(obs["joints.pos"][2]))
            write_report(self.report, self.found)
            t, q = steps[-1], np.asarray(observations[-1]["joints.pos"], dtype=float)
            rows = np.tile(q, (self.horizon, 1))  # the arm joints stay where they are
            rows[:, 2] = SCALE * (t + np.arange(self.horizon) + 1)
            return rows

        def _check(self, played_at, value):
            meant = round(value / SCALE) - 1
            f = self.found
            f["last_step"] = played_at
            if value == self.last or meant < 0:  # a hold repeats the last target exactly
                f["holds"] += 1
            elif meant < played_at:
                f["stale"] += 1
                f["stale_at"].append(played_at)
            elif meant > played_at:
                f["ahead"] += 1
            else:
                f["checked"] += 1
            self.last = value
''')


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    yield from short_dir("robotd-rt-", {"stepmod.py": STEP_POLICY})


def run_daemon(
    run_dir: Path, *overrides: str, worker: str | None = None, pythonpath: Path | None = None
) -> dict[str, Any]:
    """`robotd run` for DURATION_S on config/sim.toml in realtime timing; its summary."""
    summary = run_dir / "summary.json"
    argv = [
        sys.executable,
        "-m",
        "robotd",
        "run",
        "--config",
        str(ROOT / "config" / "sim.toml"),
        "--set",
        'control.timing="realtime"',
        "--set",
        f'runtime.dir="{run_dir}"',
        "--set",
        f'trace.dir="{run_dir}/traces"',
        "--duration",
        str(DURATION_S),
        "--summary",
        str(summary),
        "--no-status",
        *(a for o in overrides for a in ("--set", o)),
    ]
    if worker is not None:
        argv += ["--worker", worker]
    paths = [str(p) for p in (pythonpath, ROOT) if p is not None]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(summary.read_text())
    out["log_tail"] = proc.stderr[-2500:]  # shown with the summary when an assertion fails
    return out


def test_demo_policy_at_150_ms_through_a_real_worker_keeps_acting(workdir: Path) -> None:
    endpoint = f"ipc://{workdir}/demo-worker.sock"
    out = workdir / "worker.out"
    with serve_child("robotd.demo:DotFollower", endpoint, out, args=["latency_ms=150"]):
        summary = run_daemon(workdir / "a", worker=endpoint)
    assert "listening on" in out.read_text()
    assert summary["acts"] > 0 and summary["chunks"] > 0, summary
    assert summary["rows_dropped"] > 0, summary  # chunks arrived late and lost their past rows
    assert summary["stale_rows_played"] == 0, summary
    assert summary["state"] == "RUNNING" and summary["act_failures"] == 0, summary
    latency = summary["ask_latency"]
    assert latency["count"] == summary["chunks"] and latency["steps"]["p50"] >= 4, latency
    assert latency["ms"]["p50"] >= 150.0, latency


def run_step_encoder(workdir: Path, name: str, *overrides: str) -> tuple[dict, dict]:
    report = workdir / f"{name}-report.json"
    summary = run_daemon(
        workdir / name,
        'policy.serve="stepmod:StepEncoder"',
        f'policy.args.report="{report}"',
        "policy.args.latency_ms=150",
        "policy.args.horizon=16",
        "control.refill_steps=8",
        "cameras={}",
        "joints.options.tau_s=1e-6",
        "joints.options.velocity_limit=1e6",
        "joints.options.noise=0.0",
        *overrides,
        pythonpath=workdir,
    )
    return summary, json.loads(report.read_text())


def test_aligned_realtime_plays_no_row_meant_for_a_past_step(workdir: Path) -> None:
    summary, found = run_step_encoder(workdir, "aligned")
    assert summary["chunks"] >= 5 and summary["rows_dropped"] > 0, summary
    assert found["episodes"] == 1 and found["checked"] >= 40, found
    assert found["ahead"] == 0, found
    # the read after a skipped step shows the step before it: judged stale by the policy,
    # it must be a step the trace marks skipped (nothing was played there)
    ticks = _ticks(workdir / "aligned")
    skipped = {r["s"] for r in ticks if r["skipped"]}
    assert found["stale"] == len(found["stale_at"]), found
    assert set(found["stale_at"]) <= skipped, (found, sorted(skipped))
    assert summary["stale_rows_played"] == 0, summary
    played, wrong = _misplayed(ticks)
    assert played >= 40 and not wrong, (played, wrong[:10])


def _misplayed(ticks: list[dict[str, Any]]) -> tuple[int, list[tuple[int, float]]]:
    """(rows played, those meant for another step as (step, gripper target)): over the
    trace's ticks that played a row of a chunk (not a hold, not a skipped step)."""
    played = [
        (r["s"], r["target"][2])
        for r in ticks
        if r["target"] is not None and not r["held"] and not r["skipped"]
    ]
    return len(played), [(s, g) for s, g in played if round(g / 0.004) - 1 != s]


def _longest_dry_run(ticks: list[dict[str, Any]]) -> int:
    """The longest run of ticks after the first played row that held with a valid
    observation (the queue had no row: the merge's own holds), skipped steps passed over."""
    longest = run = 0
    started = False
    for r in ticks:
        if r["skipped"]:
            continue
        started = started or not r["held"]
        run = run + 1 if started and r["held"] and r["ok"] else 0
        longest = max(longest, run)
    return longest


def _ticks(run_dir: Path) -> list[dict[str, Any]]:
    """The /robot/tick records of the one episode a run recorded."""
    (path,) = sorted((run_dir / "traces").glob("*/episode-*.mcap"))
    msgs, reader = read_all(path)
    assert reader.status.complete, reader.status.message
    return [m.record for m in msgs if m.topic == "/robot/tick"]


def test_naive_realtime_is_caught_playing_late_rows(workdir: Path) -> None:
    summary, found = run_step_encoder(workdir, "naive", "control.aligned=false")
    assert summary["chunks"] >= 5, summary
    assert found["stale"] >= 20 and found["ahead"] == 0, found
    assert summary["stale_rows_played"] >= 20, summary
    _, wrong = _misplayed(_ticks(workdir / "naive"))
    assert len(wrong) >= 20 and all(round(g / 0.004) - 1 < s for s, g in wrong), wrong


@pytest.mark.parametrize("merge", ["fade", "ensemble"])
def test_blending_merges_run_end_to_end_through_the_local_worker(workdir: Path, merge: str) -> None:
    summary = run_daemon(
        workdir / merge,
        f'control.merge="{merge}"',
        "control.refill_steps=8",
        "policy.args.latency_ms=150",
    )
    assert summary["chunks"] >= 5 and summary["rows_dropped"] > 0, summary
    assert summary["state"] == "RUNNING" and summary["act_failures"] == 0, summary
    # after the first chunk the queue runs dry only when an act takes longer than refill 8
    # covers (150 ms is 5 steps; a loaded machine makes some later): the first chunk's wait,
    # and holds of an invalid observation (a camera frame late on a loaded machine), are not
    # the merge's
    slowest = summary["ask_latency"]["steps"]["p99"]  # nearest rank: the slowest of < 100
    dry = _longest_dry_run(_ticks(workdir / merge))
    assert dry <= max(0, slowest - 8) + 1, (dry, summary)
    assert summary["tracking_error"]["played_mean"] < 0.2, summary
    # the stop is logged with the run's numbers, and a clean stop warns of nothing
    log = summary["log_tail"]
    assert "run ended after" in log and f"{summary['ticks']} ticks at" in log, log
    assert f"{summary['chunks']} chunks from {summary['acts']} acts (0 failed)" in log, log
    kinds = (summary["clipped"], summary["clamped"], summary["rejected"])
    assert sum(kinds) == summary["interventions"], summary
    said = "{} shield interventions ({} clipped, {} clamped, {} rejected)"
    assert said.format(summary["interventions"], *kinds) in log, log
    assert "closed a peer" not in log, log  # the worker saw the daemon leave, no fault
