"""`robotd replay`: recorded episodes run again through the same tick code play the same
targets bit for bit, on the virtual clock (sync and realtime, every merge) and on a lane
driven by hand through everything the main process can send; a trace that differs says
where and what; a trace that cannot be replayed says why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from replay_util import HandLane, rewrite

from robotd.config import load_config
from robotd.trace.reader import read_all
from robotd.trace.replay import main as replay_main
from robotd.trace.replay import replay
from robotd.trace.replay_input import ReplayError
from robotd.virtual.runner import run_virtual
from tests.test_lane import Wave

REPO = Path(__file__).resolve().parent.parent


def episodes(run: Path) -> list[Path]:
    return sorted(run.glob("episode-*.mcap"))


def assert_replays(run: Path, count: int) -> list[Any]:
    found = episodes(run)
    assert len(found) == count
    outcomes = []
    for path in found:
        o = replay(path)
        assert o.match, o.difference.text() if o.difference else o
        assert o.targets > 0 and o.matched == o.targets == o.steps - _untargeted(path)
        outcomes.append(o)
    return outcomes


def _untargeted(path: Path) -> int:
    msgs, _ = read_all(path, ["/robot/tick"])
    return sum(m.record["target"] is None for m in msgs)


@pytest.mark.parametrize(
    ("timing", "merge", "latency_s"),
    [("sync", "replace", 0.1), ("realtime", "replace", 0.1), ("realtime", "fade", 0.2),
     ("realtime", "ensemble", 0.05)],
)
def test_virtual_runs_replay_bit_for_bit(tmp_path, timing, merge, latency_s):
    cfg = load_config(None, ["cameras={}", f'control.timing="{timing}"',
                             f'control.merge="{merge}"', "control.refill_steps=6"])
    result = run_virtual(cfg, Wave(), steps=240, latency_s=latency_s, trace_dir=tmp_path)
    assert result.trace_run is not None and result.counters["chunks"] > 10
    (o,) = assert_replays(result.trace_run, 1)
    assert o.steps == 240 and o.chunks == result.counters["chunks"]


def test_a_real_time_chunking_run_replays_bit_for_bit(tmp_path):
    from robotd.virtual.latency import jittered
    from tests.test_rtc_virtual import Recorder, config

    result = run_virtual(config("auto", "fade"), Recorder(12), steps=240,
                         latency_s=jittered(0.15, seed=3), trace_dir=tmp_path)
    assert result.counters["delay_overruns"] > 0 and result.trace_run is not None
    assert_replays(result.trace_run, 1)
    asks, _ = read_all(episodes(result.trace_run)[0], ["/policy/ask"])
    assert {m.record["delay"] for m in asks} > {1} and any(m.record["frozen"] for m in asks)


def test_the_second_episode_starts_from_the_delays_the_first_measured(tmp_path):
    lane = HandLane(tmp_path, 'control.timing="realtime"', 'control.refill_steps="auto"',
                    delay=lambda ask: 2 + ask.id % 5)
    k = lane.kernel
    lane.between(lambda: k.set_contract(12, True))
    for task in ("one", "two"):
        lane.between(lambda task=task: k.command("start", task=task))
        for _ in range(120):
            lane.tick()
        lane.between(lambda: k.command("stop"))
        lane.tick()
        lane.between(lambda: k.command("reset_done"))
    run = lane.close()
    assert_replays(run, 2)
    starts = [read_all(p, ["/robot/start_state"])[0][0].record for p in episodes(run)]
    assert starts[0]["delays"] == [] and len(starts[1]["delays"]) > 5 and starts[1]["rtc"]

    def forget(topic: str, r: dict[str, Any]) -> dict[str, Any]:
        if topic == "/robot/start_state":
            r["delays"] = []
        return r

    o = replay(rewrite(episodes(run)[1], tmp_path / "forgot", forget))
    assert o.difference is not None and o.difference.what == "ask"  # its predicted delay


def _episode_one(lane: HandLane) -> None:
    k = lane.kernel
    lane.between(lambda: k.set_contract(12))
    lane.between(lambda: k.command("start", task="hand one"))
    for i in range(200):
        if i == 90:  # a late, second answer to the first ask: discarded
            lane.between(lambda: lane.deliver(1, k.wep, 0, lane.asks[0] and _rows()))
        if i == 110:
            lane.between(lambda: k.episode_lost("copy killed by SIGKILL (scripted)"))
        if i == 150:
            lane.between(lambda: k.set_contract(10))
        lane.tick(skipped=2 if i in (40, 41, 130) else 0)
    lane.between(lambda: k.command("stop"))


def _rows() -> Any:
    from replay_util import rows_for

    return rows_for(0)


def test_a_lane_driven_through_everything_replays_bit_for_bit(tmp_path):
    lane = HandLane(tmp_path, 'control.timing="realtime"', "control.refill_steps=6",
                    'control.merge="fade"', "safety.max_acceleration=[60.0, 60.0, 60.0]",
                    fail_reads={70, 71, 160})
    _episode_one(lane)
    k = lane.kernel
    for _ in range(5):  # ENDED, RESETTING: ticks outside any episode
        lane.tick()
    lane.between(lambda: k.command("reset_done"))
    lane.between(lambda: k.command("start", task="hand two"))
    for _ in range(60):
        lane.tick()
    lane.between(lambda: k.command("estop", "scripted"))
    lane.tick()
    run = lane.close()
    one, two = assert_replays(run, 2)
    assert one.resets == 1 and one.end == {"tick": 200, "outcome": "stopped", "cause": ""}
    assert two.end is not None and two.end["outcome"] == "fault" and two.end["cause"] == "estop"
    c = k.counters
    assert c.bad_chunks >= 2 and c.act_failures >= 1 and c.late_chunks >= 1
    assert c.driver_errors == 3 and c.skipped_steps >= 4
    sh = k.shield.counters
    assert sh.clipped and sh.clamped and sh.rejected
    meta = json.loads((run / "episode-000001.json").read_text())
    assert meta["worker_episodes"] == ["hand-1", "hand-2"] and meta["task"] == "hand one"


@pytest.mark.parametrize(
    ("overrides", "fail", "outcome", "cause"),
    [(["control.max_steps=80"], set(), "max_steps", ""),
     (["control.max_hold_steps=15"], set(), "starved", ""),
     ([], {50, 51, 52}, "fault", "driver"),
     (["safety.reject_run=2"], set(), "fault", "safety")],
)
def test_endings_the_kernel_finds_itself_are_replayed(tmp_path, overrides, fail, outcome, cause):
    lane = HandLane(tmp_path, 'control.timing="realtime"', *overrides, fail_reads=fail,
                    delay=12 if outcome == "starved" else 3)
    if cause == "safety":  # every answer far out of the gripper's limits
        lane._answer = lambda ask: (lambda: lane.deliver(ask.id, ask.wep, ask.s,
                                                         _rows() + np.array([0, 0, 2.0])))
    lane.between(lambda: lane.kernel.set_contract(None))
    lane.between(lambda: lane.kernel.command("start"))
    while lane.kernel.machine.state == "RUNNING" and lane.index < 400:
        lane.tick()
    run = lane.close()
    (o,) = assert_replays(run, 1)
    assert o.end is not None and (o.end["outcome"], o.end["cause"]) == (outcome, cause)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    cfg = load_config(None, ["cameras={}", 'control.timing="realtime"', "control.refill_steps=6"])
    run = run_virtual(cfg, Wave(), steps=150, latency_s=0.1,
                      trace_dir=tmp_path_factory.mktemp("virtual")).trace_run
    assert run is not None
    return episodes(run)[0]


def test_a_changed_chunk_is_named_at_the_first_step_it_changes(recorded, tmp_path):
    def change(topic: str, r: dict[str, Any]) -> dict[str, Any]:
        if topic == "/policy/chunk" and r.get("ask") == 4:
            r["rows"][5][1] += 1e-12
        return r

    bad = rewrite(recorded, tmp_path / "run", change)
    o = replay(bad)
    assert not o.match and o.difference is not None
    d = o.difference
    chunk = next(m.record for m in read_all(bad, ["/policy/chunk"])[0] if m.record["ask"] == 4)
    assert d.what == "target" and d.step == chunk["from"] + 5  # row 5 meant for from + 5
    assert d.recorded[1] != d.replayed[1] and d.recorded[0] == d.replayed[0]
    assert o.matched < o.targets
    assert replay_main([str(bad)]) == 1


def test_a_changed_config_is_named_too(recorded, tmp_path):
    bad = rewrite(recorded, tmp_path / "run", lambda t, r: r)
    run_json = json.loads((bad.parent / "run.json").read_text())
    run_json["config"]["safety"]["max_velocity"] = [0.5, 0.5, 0.5]
    (bad.parent / "run.json").write_text(json.dumps(run_json))
    o = replay(bad)
    assert not o.match and o.difference is not None
    assert o.difference.what in ("target", "shield")


def test_a_decimated_trace_is_refused_with_the_reason(recorded, tmp_path):
    seen = {"n": 0}

    def decimate(topic: str, r: dict[str, Any]) -> dict[str, Any] | None:
        if topic == "meta":
            return {**r, "tick_every": 3}
        if topic == "/robot/tick":
            seen["n"] += 1
            return r if seen["n"] % 3 == 1 else None
        return r

    bad = rewrite(recorded, tmp_path / "run", decimate)
    why = r'one tick in 3 \(trace.ticks = 3\).*trace.ticks = "all"'
    with pytest.raises(ReplayError, match=why):
        replay(bad)


def test_a_trace_with_dropped_records_is_refused(recorded, tmp_path):
    def drop(topic: str, r: dict[str, Any]) -> Any:
        if topic == "/policy/ask" and r["id"] == 2:  # as the writer says a drop
            return "/events", {"name": "trace_drop", "tick": None, "detail": {"records": 4}}
        return r

    bad = rewrite(recorded, tmp_path / "run", drop)
    with pytest.raises(ReplayError, match="trace_drop: records were dropped"):
        replay(bad)


def test_a_trace_without_its_start_state_or_run_json_is_refused(recorded, tmp_path):
    no_start = rewrite(recorded, tmp_path / "a",
                       lambda t, r: None if t == "/robot/start_state" else r)
    with pytest.raises(ReplayError, match="no start state"):
        replay(no_start)
    alone = rewrite(recorded, tmp_path / "b", lambda t, r: r)
    (alone.parent / "run.json").unlink()
    with pytest.raises(ReplayError, match="no config snapshot beside it"):
        replay(alone)
    hostile = rewrite(recorded, tmp_path / "c", lambda t, r: {**r, "pos": "x"}
                      if t == "/robot/tick" and r["s"] == 7 else r)
    with pytest.raises(ReplayError, match=r"record \d+ \(/robot/tick\): pos is not a list of 3"):
        replay(hostile)


def test_the_command_line_exit_codes_and_json(recorded, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "robotd", "replay", str(recorded), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["match"] and out["matched"] == out["targets"] > 100
    assert out["first_difference"] is None
    proc = subprocess.run([sys.executable, "-m", "robotd", "replay", str(tmp_path / "no.mcap")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "robotd replay:" in proc.stderr


def test_the_start_state_is_what_the_replay_starts_from(tmp_path):
    lane = HandLane(tmp_path / "rec", 'control.timing="realtime"')
    lane.between(lambda: lane.kernel.set_contract(None))
    for _ in range(3):  # idle ticks: the shield anchors where the arm is
        lane.tick()
    lane.between(lambda: lane.kernel.command("start"))
    for _ in range(40):
        lane.tick()
    (path,) = episodes(lane.close())
    assert replay(path).match

    def move(topic: str, r: dict[str, Any]) -> dict[str, Any]:
        if topic == "/robot/start_state":
            r["last"][0] += 0.01  # the shield anchored a little elsewhere
        return r

    o = replay(rewrite(path, tmp_path / "run", move))
    assert o.difference is not None and o.difference.step == 0
    assert o.difference.what == "target"
