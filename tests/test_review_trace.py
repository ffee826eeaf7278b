"""Review of recording, replay and export: a run directory as a crash leaves it (an
episode file torn before its first tick was flushed, or never flushed at all), read by
`robotd trace ls`, `robotd replay` and `robotd export`."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest
from trace_util import CONFIG, tick

from robotd.trace.export import export_lerobot
from robotd.trace.ls import main as ls_main
from robotd.trace.reader import TraceReader
from robotd.trace.replay import main as replay_main
from robotd.trace.store import TraceStore
from robotd.trace.video import frames_at_ticks

BASE = 1_790_000_000_000_000_000
DT = 33_333_333  # 30 Hz
TICKS = 10


def _run(root: Path, episodes: int = 2) -> Path:
    store = TraceStore(root, 1 << 30, CONFIG)
    for e in range(episodes):
        t0 = BASE + e * 10**11
        ep = store.begin_episode(e + 1, "w1", f"task {e}", log_time_ns=t0 - 1)
        for s in range(TICKS):
            ep.write("/robot/tick", t0 + s * DT, tick(s, ep=e + 1))
        ep.end("stopped", log_time_ns=t0 + TICKS * DT)
    store.close()
    return store.run_dir


def _torn_before_any_record(run: Path, name: str) -> Path:
    """The first 100 bytes of an episode file: its header, nothing of the episode."""
    path = run / name
    path.write_bytes((run / "episode-000001.mcap").read_bytes()[:100])
    reader = TraceReader(path)
    assert list(reader.messages()) == [] and reader.episode == {}  # the precondition
    return path


def test_export_leaves_out_an_episode_torn_before_its_first_tick(tmp_path: Path) -> None:
    run = _run(tmp_path / "runs")
    _torn_before_any_record(run, "episode-000003.mcap")
    summary = export_lerobot([run], tmp_path / "ds")  # was: ValueError from numpy's reshape
    assert (summary.episodes, summary.frames) == (2, 2 * TICKS)


def test_export_leaves_out_an_episode_file_never_flushed(tmp_path: Path) -> None:
    run = _run(tmp_path / "runs")
    (run / "episode-000003.mcap").write_bytes(b"")  # SIGKILL before the first flush
    summary = export_lerobot([run], tmp_path / "ds")  # was: "not an MCAP file (bad magic)"
    assert (summary.episodes, summary.frames) == (2, 2 * TICKS)
    info = json.loads((tmp_path / "ds" / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 2 and info["total_frames"] == 2 * TICKS


def test_replay_of_a_file_without_its_episode_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _torn_before_any_record(_run(tmp_path / "runs"), "episode-000003.mcap")
    assert replay_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "no episode metadata" in err and "torn" in err
    assert "trace.ticks = None" not in err  # was: blamed on decimated ticks


def test_trace_ls_of_a_run_directory_lists_that_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path / "runs")
    assert ls_main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "no runs" not in out  # was: "RUN: no runs"
    assert out.count("stopped") == 2 and "'task 1'" in out


def _png(value: int) -> bytes:
    ok, buf = cv2.imencode(".png", np.full((8, 8, 3), value, np.uint8))
    assert ok
    return buf.tobytes()


def test_video_never_steps_back_to_a_frame_recorded_late() -> None:
    # file order 0, 100, 93, 108: frame 93 was recorded after frame 100 (a late upload)
    frames = [(0, _png(10)), (100, _png(100)), (93, _png(93)), (108, _png(108))]
    shown = [int(img[0, 0, 0]) for img in frames_at_ticks(frames, np.array([0, 100, 105, 108]))]
    assert shown == [10, 100, 100, 108]  # was: [10, 93, 93, 108]


def test_a_faults_cause_reaches_the_sidecar_ls_and_the_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = TraceStore(tmp_path / "runs", 1 << 30, CONFIG)
    ep = store.begin_episode(1, "w1", "grasp", log_time_ns=BASE - 1)
    for s in range(TICKS):
        ep.write("/robot/tick", BASE + s * DT, tick(s))
    ep.end("fault", log_time_ns=BASE + TICKS * DT, tick=TICKS,
           detail={"outcome": "fault", "cause": "estop"})
    store.close()
    run = store.run_dir
    assert json.loads((run / "episode-000001.json").read_text())["cause"] == "estop"
    assert ls_main([str(tmp_path / "runs")]) == 0
    assert "fault:estop" in capsys.readouterr().out  # was: "fault", an e-stop or a bus error
    export_lerobot([run], tmp_path / "ds")
    rows = pq.read_table(tmp_path / "ds" / "meta/episodes/chunk-000/file-000.parquet")
    assert rows.column("robotd/cause").to_pylist() == ["estop"]
