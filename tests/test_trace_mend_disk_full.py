"""A full disk mid-run, on a real 5 MB tmpfs: the episode whose file a write error closed
still gets its end in its sidecar (outcome, ended, what is on disk and what was lost), the
session file starts again in a new segment once writes succeed (said once in the log), no
``.tmp`` is ever left behind, and ``trace ls`` says "recording stopped: disk full" rather
than "did not close". The trace store on its own, and a real daemon run."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from trace_util import CONFIG, tick

import robotd.trace.openfiles as openfiles_mod
import robotd.trace.pending as pending_mod
from robotd.operator.robotctl import ControlClient
from robotd.trace.reader import read_all
from robotd.trace.rundir import RESERVE
from robotd.trace.store import TraceStore
from tests.daemon_util import Daemon, wait_until

REPO = Path(__file__).resolve().parent.parent
BASE = 1_790_000_000_000_000_000
DT = 33_333_333


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A real 5 MB tmpfs (skipped where mounting is not permitted), unmounted after."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a 5 MB tmpfs to fill (needs root): {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path, leave: int = 0) -> None:
    """Fill the filesystem of `path` (a new file) until `leave` bytes or fewer are free."""
    with open(path, "wb", buffering=0) as f:
        for block in (1 << 16, 1 << 12):
            with contextlib.suppress(OSError):
                while os.statvfs(path).f_bavail * os.statvfs(path).f_frsize - block >= leave:
                    f.write(b"\0" * block)


def _tmp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def _ls(root: Path) -> str:
    p = subprocess.run([sys.executable, "-m", "robotd", "trace", "ls", str(root)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def _ticks(ep, start: int, n: int) -> None:
    for s in range(start, start + n):
        ep.write("/robot/tick", BASE + s * DT, tick(s))


def test_the_store_keeps_the_end_and_reopens_the_session(disk, monkeypatch, caplog):
    for mod in (openfiles_mod, pending_mod):  # retry at the next chance, not a second later
        monkeypatch.setattr(mod, "RETRY_S", 0.0)
    caplog.set_level(logging.WARNING, logger="robotd.trace")
    store = TraceStore(disk / "runs", 1 << 30, CONFIG, fsync=False)
    run = store.run_dir
    assert run is not None and (run / RESERVE).is_file()
    store.write("/operator", BASE - 2, {"cmd": "start", "args": {}, "ok": True})
    ep = store.begin_episode(1, "w1", "pick", log_time_ns=BASE - 1)
    _ticks(ep, 0, 20)
    assert store.flush()
    (run / RESERVE).unlink()  # as if spent already: the sidecar itself must wait for room
    fill(disk / "filler")
    _ticks(ep, 20, 400)  # more than a page: the flush cannot land
    assert store.flush()
    assert "No space left on device; file closed" in caplog.text
    ep.end("stopped", {"success": True, "notes": "kept"}, log_time_ns=BASE + 500 * DT)
    store.write("/operator", BASE + 501 * DT, {"cmd": "stop", "args": {}, "ok": True})
    noise = {"k": os.urandom(12_000).hex()}  # incompressible: more than the page's slack
    store.write("/events", BASE + 501 * DT, {"name": "x", "tick": 1, "detail": noise})
    assert store.flush()  # the session breaks on this flush (no room)
    assert json.loads((run / "episode-000001.json").read_text())["ended"] is None
    (disk / "filler").unlink()
    store.write("/operator", BASE + 600 * DT, {"cmd": "reset_done", "args": {}, "ok": True})
    assert store.flush() and store.flush()  # a retry round runs between two flushes
    side = json.loads((run / "episode-000001.json").read_text())
    assert side["outcome"] == "stopped" and side["ended"]
    assert side["verdict"] == {"success": True, "notes": "kept"}
    stopped = side["recording_stopped"]
    assert stopped["disk_full"] and "No space left" in stopped["error"]
    assert stopped["recorded_ticks"] == 20 and stopped["lost_ticks"] == 400
    assert side["ticks"] == 420
    store.write("/operator", BASE + 700 * DT, {"cmd": "start", "args": {}, "ok": True})
    store.close()
    assert (run / "session-1.mcap").is_file()
    msgs, reader = read_all(run / "session-1.mcap")
    assert reader.status.complete
    assert [m.record["cmd"] for m in msgs if m.topic == "/operator"] == ["reset_done", "start"]
    msgs, _ = read_all(run / "session.mcap")
    assert [m.record["cmd"] for m in msgs if m.topic == "/operator"] == ["start"]
    assert caplog.text.count("the session continues in session-1.mcap") == 1
    info = json.loads((run / "run.json").read_text())
    assert info["ended"] and {s["file"] for s in info["recording_stopped"]} == {
        "episode-000001.mcap", "session.mcap"}
    assert _tmp_files(disk) == [] and not (run / RESERVE).exists()
    out = _ls(disk / "runs")
    assert "recording stopped: disk full (episode-000001.mcap, session.mcap)" in out
    assert "did not close" not in out
    assert "stopped" in out and "the file holds 20 ticks" in out and "400 lost" in out


def test_a_daemon_run_through_a_full_disk(disk, tmp_path):
    fill(disk / "filler", leave=800_000)
    traces = disk / "traces"
    d = Daemon(tmp_path, "--set", 'robot.start="idle"', "--set", f'trace.dir="{traces}"')
    d.wait_line(r"operator socket")
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        assert c.request("start", {"task": "one"})["ok"]
        d.wait_line(r"episode-000001\.mcap: \[Errno 28\] No space left on device; file closed",
                    timeout=90)
        (disk / "filler").unlink()
        assert c.request("stop")["ok"]
        assert c.request("verdict", {"success": True, "notes": "after the disk came back"})["ok"]
        assert c.request("reset_done")["ok"]
        assert c.request("start", {"task": "two"})["ok"]
        wait_until(lambda: c.request("status")["result"]["step"] >= 30, 60, "30 steps")
        assert c.request("stop")["ok"]
    finally:
        c.close()
    d.signal(signal.SIGTERM)
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    (run,) = [p for p in traces.iterdir() if p.is_dir()]
    one = json.loads((run / "episode-000001.json").read_text())
    assert one["ended"] and one["outcome"] == "stopped"
    assert one["verdict"] == {"success": True, "notes": "after the disk came back"}
    stopped = one["recording_stopped"]
    assert stopped["disk_full"] and stopped["lost_ticks"] > 0
    assert stopped["recorded_ticks"] + stopped["lost_ticks"] == one["ticks"]
    assert stopped["recorded_s"] < one["duration_s"]
    two = json.loads((run / "episode-000002.json").read_text())
    assert two["outcome"] == "stopped" and "recording_stopped" not in two
    info = json.loads((run / "run.json").read_text())
    assert info["ended"] and info["recording_stopped"]
    assert _tmp_files(disk) == []
    cmds = []
    for path in sorted(run.glob("session*.mcap")):
        msgs, _ = read_all(path)
        cmds += [m.record["cmd"] for m in msgs if m.topic == "/operator"]
    assert {"verdict", "reset_done"} <= set(cmds)
    out = _ls(traces)
    assert "recording stopped: disk full" in out and "did not close" not in out
    assert "cut_off" not in out
