"""The disk budget: oldest runs go first, with a log line; a run in use (ours, or another
daemon's) is never deleted; then the oldest finished episodes of the current run."""

from __future__ import annotations

import datetime as dt
import logging
import os

from trace_util import CONFIG, tick

from robotd.trace.rundir import RUN_JSON, RunLock, make_run_dir, write_json_atomic
from robotd.trace.store import TraceStore


def _old_run(root, days_ago: int, size: int):
    run = make_run_dir(root, dt.datetime.now(dt.UTC) - dt.timedelta(days=days_ago))
    write_json_atomic(run / RUN_JSON, {"config": {}})
    (run / "episode-000001.mcap").write_bytes(b"\0" * size)
    return run


def test_oldest_runs_go_first_and_runs_in_use_stay(tmp_path, caplog):
    root = tmp_path / "runs"
    a, b, c, d = (_old_run(root, days, 100_000) for days in (40, 30, 20, 10))
    other_daemon = RunLock(b)  # b is being written by another daemon sharing the root
    (root / "notes.txt").write_text("not a run: never touched")
    with caplog.at_level(logging.WARNING, "robotd.trace"):
        store = TraceStore(root, 250_000, CONFIG)
        assert store.flush()  # the writer thread applied the budget before anything else
    try:
        assert not a.exists() and not c.exists()  # the oldest that were free to go
        assert b.exists() and d.exists() and store.run_dir.exists()
        assert (root / "notes.txt").exists()
        assert f"deleted run {a.name}" in caplog.text and f"deleted run {c.name}" in caplog.text
        assert store.stats().runs_deleted == 2
    finally:
        store.close()
        other_daemon.release()


def test_current_run_loses_its_oldest_finished_episodes_never_the_open_one(tmp_path, caplog):
    root = tmp_path / "runs"
    store = TraceStore(root, 1 << 20, CONFIG, flush_bytes=1 << 16)
    blob = os.urandom(700_000)  # incompressible: two episodes pass the 1 MiB budget
    with caplog.at_level(logging.WARNING, "robotd.trace"):
        for n in (1, 2, 3):
            ep = store.begin_episode(n, "w1", None)
            ep.write("/robot/tick", n, tick(0))
            ep.frame("top", n, blob, 0)
            if n < 3:
                ep.end("stopped")
        assert store.flush()
        run = store.run_dir
        names = sorted(p.name for p in run.iterdir())
        assert "episode-000003.mcap" in names  # open: never deleted
        assert "episode-000001.mcap" not in names and "episode-000001.json" not in names
        assert "deleted episode episode-000001.mcap of the current run" in caplog.text
        ep.end("stopped")
    store.close()
