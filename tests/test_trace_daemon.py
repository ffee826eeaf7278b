"""The trace of a real daemon run: every event kind recorded as it happened (operator
commands, episodes, chunks, frames, link events), each episode replayed to the same targets
bit for bit, a worker killed mid-episode included, the run exported and read back frame by
frame, and the live view and telemetry serving the same robot. Real processes throughout."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest
import websockets
import zmq

from robotd import wire
from robotd.operator.robotctl import ControlClient
from robotd.trace.codec import frame_bytes
from robotd.trace.export import export_lerobot
from robotd.trace.reader import read_all
from robotd.trace.replay import replay
from tests.daemon_util import Daemon, processes_mentioning, wait_until


def _status(c: ControlClient) -> dict[str, Any]:
    return c.request("status")["result"]


def wait_steps(c: ControlClient, n: int, wep: str | None = None, timeout: float = 60) -> None:
    """Until the running episode (of worker episode `wep`, if given) has made `n` steps."""

    def far() -> bool:
        st = _status(c)
        return st.get("state") == "RUNNING" and st["step"] >= n and wep in (None, st["wep"])

    wait_until(far, timeout, f"{n} steps")


def _run_dir(d: Daemon) -> Path:
    (run,) = [p for p in d.traces.iterdir() if p.is_dir()]
    return run


def _topics(path: Path) -> dict[str, list[dict[str, Any]]]:
    msgs, reader = read_all(path)
    assert reader.status.complete, reader.status.message
    out: dict[str, list[dict[str, Any]]] = {}
    for m in msgs:
        out.setdefault(m.topic, []).append(m.record)
    return out


def _replays(path: Path) -> None:
    o = replay(path)
    assert o.match, o.difference.text() if o.difference else o
    assert o.targets > 30 and o.matched == o.targets


def _telemetry(d: Daemon) -> dict[str, Any]:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"status")
    sub.connect(f"ipc://{d.dir}/telemetry.sock")
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert sub.poll(10_000), "no telemetry"
            msg = wire.unpackb(sub.recv_multipart()[1])
            if msg["robot"]["target"] is not None:
                return msg
        raise AssertionError("telemetry never carried a target")
    finally:
        sub.close()


@pytest.fixture(scope="module")
def operated(tmp_path_factory) -> tuple[Daemon, dict[str, Any]]:
    """A sim daemon (sync timing) an operator drives through two episodes: start (a task),
    stop, verdict, reset_done, start, e-stop, clear_fault; then SIGTERM."""
    # the policy's frames: this run checks that the uplink's own JPEG is what is recorded
    # (tests/test_trace_frames_daemon.py records "all", the default)
    d = Daemon(tmp_path_factory.mktemp("op"), "--set", 'robot.start="idle"',
               "--set", 'control.timing="sync"', "--set", 'trace.frames="policy"')
    d.wait_line(r"operator socket")
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        assert c.request("start", {"task": "follow the dot"})["ok"]
        wait_steps(c, 45)
        telemetry = _telemetry(d)
        assert c.request("stop")["ok"]
        assert c.request("verdict", {"success": True, "notes": "smooth"})["ok"]
        assert not c.request("start")["ok"]  # ENDED: refused, and recorded so
        assert c.request("reset_done")["ok"]
        assert c.request("start", {"task": "again"})["ok"]
        wait_steps(c, 45)
        assert c.request("estop", {"reason": "hand in the way"})["ok"]
        assert c.request("clear_fault")["ok"]
    finally:
        c.close()
    d.signal(signal.SIGTERM)
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    return d, telemetry


def test_every_event_kind_of_a_daemon_run_is_recorded(operated):
    d, _ = operated
    run = _run_dir(d)
    one, two = (_topics(run / f"episode-00000{i}.mcap") for i in (1, 2))
    for ep in (one, two):
        assert {"/robot/tick", "/policy/ask", "/policy/chunk", "/events", "/robot/start_state",
                "/link", "/camera/top"} <= set(ep)
        ticks = ep["/robot/tick"]
        assert [t["s"] for t in ticks] == list(range(len(ticks)))  # every tick, in order
        assert all(t["cams"]["top"] is not None for t in ticks)
        assert {lk["kind"] for lk in ep["/link"]} == {"upload"}
        assert all(c["result"] == "merged" and len(c["rows"]) == 16 for c in ep["/policy/chunk"])
    assert one["/robot/start_state"][0]["task"] == "follow the dot"
    # commands are recorded as answered: the one that ended an episode comes just after it
    # (an e-stop's answer comes on the lane's own socket: just before or just after)
    assert [(o["cmd"], o["ok"]) for o in one["/operator"]] == [("start", True)]
    assert [o["cmd"] for o in two["/operator"]] in (["start"], ["start", "estop"])
    assert two["/operator"][0]["args"] == {"task": "again"}
    end1 = one["/events"][-1]
    assert end1["name"] == "episode_end" and end1["detail"]["outcome"] == "stopped"
    end2 = two["/events"][-1]
    assert (end2["detail"]["outcome"], end2["detail"]["cause"]) == ("fault", "estop")
    side = json.loads((run / "episode-000001.json").read_text())
    assert side["outcome"] == "stopped" and side["verdict"] == {"success": True, "notes": "smooth"}
    assert side["task"] == "follow the dot" and side["ticks"] == len(one["/robot/tick"])
    session = _topics(run / "session.mcap")
    ops = [(o["cmd"], o["ok"]) for o in session["/operator"] if o["cmd"] != "estop"]
    assert ops == [("stop", True), ("verdict", True), ("start", False), ("reset_done", True),
                   ("clear_fault", True)]
    estops = [o for o in session["/operator"] + two["/operator"] if o["cmd"] == "estop"]
    assert [(o["ok"], o["args"]) for o in estops] == [(True, {"reason": "hand in the way"})]
    names = [e["name"] for e in session["/events"]]
    assert {"contract", "verdict", "reset_done", "fault", "lane_estop", "fault_cleared"} <= set(
        names)
    frame = two["/camera/top"][0]
    img = cv2.imdecode(np.frombuffer(frame_bytes(frame), np.uint8), cv2.IMREAD_COLOR)
    assert frame["format"] == "jpeg" and img.shape == (224, 224, 3)  # the uplink's own JPEG
    # trace.frames = "policy": one frame per upload, not one per tick, of the cameras it reads
    assert len(two["/camera/top"]) < len(two["/robot/tick"]) / 3
    assert not any(t.startswith("/camera/") and t != "/camera/top" for t in one | two)
    info = json.loads((run / "run.json").read_text())
    assert info["ended"] and info["stats"]["dropped_records"] == 0


def test_the_episodes_of_a_daemon_run_replay_bit_for_bit(operated):
    d, _ = operated
    run = _run_dir(d)
    for path in sorted(run.glob("episode-*.mcap")):
        _replays(path)


def test_telemetry_carries_the_joints_targets_and_queue(operated):
    _, msg = operated
    robot = msg["robot"]
    assert len(robot["pos"]) == 3 and len(robot["target"]) == 3
    assert isinstance(robot["queue"], int) and 0 <= robot["queue"] <= 16
    assert len(wire.packb(robot)) < 200


def _frames_at_ticks(path: Path) -> list[np.ndarray]:
    """Per recorded tick, the newest recorded frame captured by then (BGR)."""
    msgs, _ = read_all(path)
    frames = [(m.log_time, m.record) for m in msgs if m.topic == "/camera/top"]
    out, i, current = [], 0, None
    for m in (m for m in msgs if m.topic == "/robot/tick"):
        while i < len(frames) and (current is None or frames[i][0] <= m.log_time):
            data = np.frombuffer(frame_bytes(frames[i][1]), np.uint8)
            current, i = cv2.imdecode(data, cv2.IMREAD_COLOR), i + 1
        out.append(current)
    return out


def test_a_recorded_run_exports_and_reads_back_frame_by_frame(operated, tmp_path):
    d, _ = operated
    run = _run_dir(d)
    summary = export_lerobot([run], tmp_path / "ds")
    assert summary.episodes == 2 and summary.cameras == ["top"]
    for e in range(2):
        path = run / f"episode-00000{e + 1}.mcap"
        ticks = _topics(path)["/robot/tick"]
        table = pq.read_table(tmp_path / f"ds/data/chunk-000/file-{e:03d}.parquet").to_pylist()
        assert len(table) == len(ticks)
        action = None
        for row, t in zip(table, ticks):
            assert np.array_equal(np.float32(row["observation.state"]), np.float32(t["pos"]))
            # a step that wrote no target (one an overrun skipped on a loaded machine:
            # nothing read, nothing played) keeps the last target, or the position before any
            action = t["target"] if t["target"] is not None else action
            want = action if action is not None else t["pos"]
            assert np.array_equal(np.float32(row["action"]), np.float32(want))
        video = cv2.VideoCapture(
            str(tmp_path / f"ds/videos/observation.images.top/chunk-000/file-{e:03d}.mp4"))
        expected = _frames_at_ticks(path)
        for want in expected:
            ok, img = video.read()
            assert ok and img.shape == (224, 224, 3)
            assert np.abs(img.astype(int) - want).mean() < 10  # the same picture, re-encoded
        assert not video.read()[0]  # one video frame per tick, no more


def test_a_worker_killed_mid_episode_resets_it_and_the_replay_still_matches(tmp_path):
    d = Daemon(tmp_path, "--set", 'control.timing="realtime"',  # real-time chunking too
               "--set", 'policy.serve="tests.trace_policies:RawDotFollower"',
               "--set", "policy.args={rtc=true}")
    d.wait_line(r"episode_start")
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        wait_steps(c, 40)
        (worker,) = [p for p in processes_mentioning(f"--bind stream+ipc://{d.dir}/worker-")
                     if b" serve " in Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")]
        old = _status(c)["wep"]
        os.kill(worker, signal.SIGKILL)
        d.wait_line(r"episode_reset .*local worker killed by SIGKILL")
        wait_until(lambda: _status(c)["wep"] != old, 10, "the new worker-side episode")
        new = _status(c)["wep"]
        chunks = c.request("stats")["result"]["chunks"]
        wait_until(lambda: c.request("stats")["result"]["chunks"] >= chunks + 3, 60,
                   "chunks from the restarted worker")
    finally:
        c.close()
    d.signal(signal.SIGINT)
    assert d.wait_exit() == 0
    (path,) = sorted(_run_dir(d).glob("episode-*.mcap"))
    _replays(path)
    ep = _topics(path)
    assert {t["wep"] for t in ep["/robot/tick"]} == {old, new}
    assert {c["wep"] for c in ep["/policy/chunk"]} == {old, new}  # both workers answered
    reconnects = [lk["detail"] for lk in ep["/link"] if lk["kind"] == "reconnect"]
    assert [r["state"] for r in reconnects] == ["gone", "back"]
    assert "local worker killed by SIGKILL" in reconnects[0]["reason"]
    assert reconnects[1]["away_s"] > 0
    (reset,) = [lk["detail"] for lk in ep["/link"] if lk["kind"] == "episode_reset"]
    assert (reset["old_wep"], reset["new_wep"]) == (old, new)
    assert json.loads(path.with_suffix(".json").read_text())["worker_episodes"] == [old, new]
    frame = ep["/camera/top"][-1]
    img = cv2.imdecode(np.frombuffer(frame_bytes(frame), np.uint8), cv2.IMREAD_COLOR)
    assert frame["format"] == "jpeg" and img.shape == (480, 640, 3)  # raw up: JPEG for the trace
    asks = ep["/policy/ask"]
    assert all(a["delay"] >= 1 for a in asks) and any(a["frozen"] for a in asks)  # rtc acts


async def _live(port: int) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    async with websockets.connect(f"ws://127.0.0.1:{port}",
                                  subprotocols=["foxglove.sdk.v1"]) as ws:
        channels: dict[str, Any] = {}
        while "/robot/tick" not in channels:
            msg = await asyncio.wait_for(ws.recv(), deadline - time.monotonic())
            if isinstance(msg, str) and json.loads(msg).get("op") == "advertise":
                channels |= {ch["topic"]: ch for ch in json.loads(msg)["channels"]}
        sub = {"op": "subscribe", "subscriptions": [{"id": 1,
                                                     "channelId": channels["/robot/tick"]["id"]}]}
        await ws.send(json.dumps(sub))
        while True:
            msg = await asyncio.wait_for(ws.recv(), deadline - time.monotonic())
            if isinstance(msg, bytes) and msg[0] == 1:  # message data: op, sub id, time, body
                return json.loads(msg[1 + 4 + 8:])


def test_run_foxglove_serves_the_same_channels_live(tmp_path):
    d = Daemon(tmp_path, "--foxglove", "0")
    line = d.wait_line(r"live view: ws://127\.0\.0\.1:\d+")
    port = int(re.search(r":(\d+) ", line + " ").group(1))
    d.wait_line(r"episode_start")
    record = asyncio.run(_live(port))
    assert {"s", "pos", "target", "cams", "tick"} <= set(record)
    d.signal()
    assert d.wait_exit() == 0
