"""`robotd trace ls` and `robotd trace show`: runs, episodes, timelines, as text and JSON,
including a run whose daemon died without closing its files."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import pyarrow.parquet as pq
from trace_util import CONFIG, tick

from robotd.cli import main as robotd_main
from robotd.trace.export import export_lerobot
from robotd.trace.store import TraceStore


def _recorded(root):
    store = TraceStore(root, 1 << 30, CONFIG)
    ep = store.begin_episode(1, "w1", "pick the cube", log_time_ns=1_000)
    for s in range(30):
        ep.write("/robot/tick", 1_000 + s * 33_000_000, tick(s) | {"held": s >= 20,
                 "shield": "", "ok": True, "skipped": False})
    ep.write("/policy/ask", 2_000, {"id": 1, "wep": "w1", "s": 3, "queue": 1, "delay": 2})
    ep.end("stopped", {"success": True, "notes": "clean grasp"}, log_time_ns=10**9)
    store.close()
    return store.run_dir


def _crashed_child(root: str) -> None:
    store = TraceStore(root, 1 << 30, CONFIG, fsync=False)
    ep = store.begin_episode(7, "w1", None)
    for s in range(12):
        ep.write("/robot/tick", 5_000 + s, tick(s))
    store.flush()
    os._exit(0)  # dies without closing anything


def test_ls_lists_runs_and_episodes(tmp_path, capsys):
    root = tmp_path / "runs"
    run = _recorded(root)
    proc = multiprocessing.get_context("fork").Process(target=_crashed_child, args=(str(root),))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert robotd_main(["trace", "ls", str(root)]) == 0
    text = capsys.readouterr().out
    assert run.name in text and "stopped" in text and "success (clean grasp)" in text
    assert "30 ticks" in text and "'pick the cube'" in text
    assert "did not close" in text and "not closed (the writer stopped)" in text
    assert "cut_off" in text  # the episode the daemon never ended, said so
    assert robotd_main(["trace", "ls", str(root), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [len(r["episodes"]) for r in runs] == [1, 1] and not any(r["in_use"] for r in runs)
    ok, crashed = runs[0]["episodes"][0], runs[1]["episodes"][0]
    assert ok["outcome"] == "stopped" and ok["ticks"] == 30 and ok["verdict"]["success"]
    assert crashed["episode"] == 7 and crashed["ticks"] == 12 and crashed["outcome"] == "cut_off"


def test_show_timeline_text_all_and_json(tmp_path, capsys):
    path = _recorded(tmp_path / "runs") / "episode-000001.mcap"
    assert robotd_main(["trace", "show", str(path)]) == 0
    text = capsys.readouterr().out
    assert "complete" in text and "task 'pick the cube'" in text
    assert "ticks s=0..19 (20) moving" in text and "ticks s=20..29 (10) held" in text
    assert "ask id=1 s=3 queue=1 delay=2" in text and 'outcome="stopped"' in text
    assert robotd_main(["trace", "show", str(path), "--all"]) == 0
    assert capsys.readouterr().out.count(" tick s=") == 30
    assert robotd_main(["trace", "show", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"]["complete"] and doc["end"]["outcome"] == "stopped"
    topics = [m["topic"] for m in doc["timeline"]]
    assert topics.count("/robot/tick") == 30 and topics.count("/events") == 2


def test_show_says_a_file_is_torn_and_refuses_a_stranger(tmp_path, capsys):
    path = _recorded(tmp_path / "runs") / "episode-000001.mcap"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    assert robotd_main(["trace", "show", str(path)]) == 0
    assert "torn:" in capsys.readouterr().out
    stranger = tmp_path / "x.mcap"
    stranger.write_bytes(b"hello world, not mcap")
    assert robotd_main(["trace", "show", str(stranger)]) == 2
    assert "not an MCAP file" in capsys.readouterr().err


def test_cli_runs_as_a_program(tmp_path):
    root = tmp_path / "runs"
    _recorded(root)
    proc = subprocess.run([sys.executable, "-m", "robotd", "trace", "ls", str(root)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "episode    1" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "robotd", "trace", "ls", str(tmp_path / "no")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no such directory" in proc.stderr


def test_show_and_ls_survive_records_and_sidecars_of_the_wrong_shape(tmp_path, capsys):
    store = TraceStore(tmp_path / "runs", 1 << 30, CONFIG)
    ep = store.begin_episode(1, "w1", None)
    for channel, record in [
        ("/events", {"name": 5, "tick": "x", "detail": [1, 2]}),
        ("/policy/chunk", {"rows": 7}),
        ("/robot/tick", {"pos": "up", "target": {"a": 1}, "held": "no"}),
        ("/operator", {}),
        ("/link", {"kind": None}),
    ]:
        ep.write(channel, 1, record)
    ep.end("stopped")
    store.close()
    run = store.run_dir
    (run / "episode-000001.json").write_text(json.dumps(
        {"ended": "yes", "episode": {"x": 1}, "verdict": "great", "ticks": [1], "task": 3}))
    assert robotd_main(["trace", "show", str(run / "episode-000001.mcap")]) == 0
    assert robotd_main(["trace", "show", str(run / "episode-000001.mcap"), "--all"]) == 0
    assert robotd_main(["trace", "ls", str(tmp_path / "runs")]) == 0
    assert robotd_main(["trace", "ls", str(tmp_path / "runs"), "--json"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_an_episode_the_daemon_never_ended_exports_as_cut_off(tmp_path):
    root = tmp_path / "runs"
    proc = multiprocessing.get_context("fork").Process(target=_crashed_child, args=(str(root),))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    export_lerobot([run], tmp_path / "ds")
    eps = pq.read_table(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [(e["length"], e["robotd/outcome"]) for e in eps] == [(12, "cut_off")]


def test_a_directory_or_a_fifo_is_not_taken_for_a_trace(tmp_path, capsys):
    fifo = tmp_path / "pipe.mcap"
    os.mkfifo(fifo)  # opened without O_NONBLOCK, reading it would wait for a writer forever
    for argv, said in (
        (["trace", "show", str(tmp_path)], "a directory, not a trace file"),
        (["replay", str(tmp_path)], "a directory, not a trace file"),
        (["trace", "show", str(fifo)], "not a regular file, not a trace file"),
    ):
        assert robotd_main(argv) == 2, argv
        assert said in capsys.readouterr().err, argv
    (tmp_path / "f.mcap").write_bytes(b"")
    assert robotd_main(["trace", "ls", str(tmp_path / "f.mcap")]) == 2
    assert "a file: ls lists a trace root or a run directory" in capsys.readouterr().err


def test_show_of_the_session_file_says_what_it_is(tmp_path, capsys):
    store = TraceStore(tmp_path / "runs", 1 << 30, CONFIG)
    store.write("/events", 5_000, {"name": "fault", "tick": 3, "detail": {"cause": "estop"}})
    store.close()
    run = store.run_dir
    assert robotd_main(["trace", "show", str(run / "session.mcap")]) == 0
    text = capsys.readouterr().out
    assert f"session of run {run.name}" in text and "episode None" not in text, text
    assert "None Hz" not in text, text


def test_show_folds_a_frame_before_every_tick_beside_the_ticks(tmp_path, capsys):
    import cv2
    import numpy as np

    ok, jpeg = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))
    assert ok
    store = TraceStore(tmp_path / "runs", 1 << 30, CONFIG)
    ep = store.begin_episode(1, "w1", "t", log_time_ns=1_000)
    for s in range(20):  # as trace.frames = "all" records: each tick's frame just before it
        t = 2_000 + s * 33_000_000
        ep.frame("top", t - 500, jpeg.tobytes(), 100 + s)
        ep.write("/robot/tick", t, tick(s) | {"held": False, "shield": "", "ok": True,
                                             "skipped": False})
    ep.end("stopped", log_time_ns=10**9)
    store.close()
    assert robotd_main(["trace", "show", str(store.run_dir / "episode-000001.mcap")]) == 0
    out = capsys.readouterr().out
    assert "ticks s=0..19 (20) moving" in out and "frames top #100..#119 (20)" in out, out
    assert " tick s=" not in out and "frame top #" not in out, out


def test_a_reader_that_goes_away_ends_show_quietly(tmp_path):
    store = TraceStore(tmp_path / "runs", 1 << 30, CONFIG, fsync=False)
    ep = store.begin_episode(1, "w1", "t", log_time_ns=1_000)
    for s in range(3000):  # far more output than a pipe holds: the writes must meet the close
        ep.write("/robot/tick", 2_000 + s * 33_000_000, tick(s))
    ep.end("stopped")
    store.close()
    path = store.run_dir / "episode-000001.mcap"
    proc = subprocess.Popen([sys.executable, "-m", "robotd", "trace", "show", "--all", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline()  # as `| head -1` does
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141 and b"Traceback" not in err, err.decode()[-2000:]


def test_folding_holds_a_run_not_its_records():
    import tracemalloc

    from robotd.trace.reader import TraceMessage
    from robotd.trace.show import _fold

    def messages():  # an episode of one run: 3000 ticks, a 20 kB frame before each
        for s in range(3000):
            yield TraceMessage("/camera/top", s * 10, s, {"frame_index": s, "data": "x" * 20_000})
            yield TraceMessage("/robot/tick", s * 10 + 1, s, tick(s) | {"held": False,
                               "shield": "", "ok": True, "skipped": False})

    tracemalloc.start()
    try:
        lines = [text for _, text in _fold(messages())]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines == ["ticks s=0..2999 (3000) moving", "frames top #0..#2999 (3000)"], lines
    assert peak < 5_000_000, peak  # the 60 MB of frames were never held
