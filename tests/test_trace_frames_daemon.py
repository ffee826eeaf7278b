"""``trace.frames`` in a real daemon run of the sim config: in "all" mode one /camera/NAME
record per frame the ticks saw, at the camera's resolution (those the ring overwrote
counted instead), a LeRobot export whose video shows each tick's own frame, and trace show
and replay as in any trace. What "policy" records is checked by tests/test_trace_daemon.py's
run, and ``true`` meaning "policy" at load by tests/test_trace_all_frames.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from robotd.trace.codec import frame_bytes
from robotd.trace.export import export_lerobot
from robotd.trace.reader import read_all
from robotd.trace.replay import replay
from robotd.trace.show import main as show_main
from tests.daemon_util import Daemon

SIZES = {"top": (480, 640), "wrist": (240, 320)}  # config/sim.toml's cameras (h, w)


def _recorded(tmp: Path, frames: str) -> tuple[Path, list[Any], dict[str, Any]]:
    """A 4 s sim run (realtime timing, the local demo worker) with trace.frames=`frames`:
    its episode file, its messages, its run.json."""
    d = Daemon(tmp, "--set", f"trace.frames={frames}", "--duration", "4")
    assert d.wait_exit(120) == 0, "".join(d.log[-30:])
    (run,) = [p for p in d.traces.iterdir() if p.is_dir()]
    path = run / "episode-000001.mcap"
    msgs, _ = read_all(path)
    return path, msgs, json.loads((run / "run.json").read_text())


@pytest.fixture(scope="module")
def all_run(tmp_path_factory):
    return _recorded(tmp_path_factory.mktemp("all"), '"all"')


def _img(record: dict[str, Any]) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(frame_bytes(record), np.uint8), cv2.IMREAD_COLOR)


def _ticks(msgs) -> list[dict[str, Any]]:
    return [m.record for m in msgs if m.topic == "/robot/tick"]


def test_all_mode_records_each_frame_the_ticks_saw_at_the_cameras_size(all_run):
    _, msgs, info = all_run
    ticks = _ticks(msgs)
    assert len(ticks) > 60
    lost_events = [m.record["detail"] for m in msgs if m.record.get("name") == "frames_lost"]
    lost = lost_events[-1]["cameras"] if lost_events else {}
    for cam, (h, w) in SIZES.items():
        seen = {t["cams"][cam][0] for t in ticks if t["cams"].get(cam) is not None}
        frames = [m for m in msgs if m.topic == f"/camera/{cam}"]
        indices = [m.record["frame_index"] for m in frames]
        assert len(indices) == len(set(indices))  # each once
        assert min(seen) <= min(indices) and max(indices) <= max(seen)
        # every frame the ticks saw, but those its ring overwrote first (counted)
        assert len(seen - set(indices)) == lost.get(cam, 0)
        assert len(indices) >= 0.9 * len(seen)
        for m in frames[:3] + frames[-3:]:
            assert m.record["format"] == "jpeg" and _img(m.record).shape == (h, w, 3)
        # at its capture time, on the ticks' clock: a tick's reference names it exactly
        by_index = {m.record["frame_index"]: m.log_time for m in frames}
        offsets = {by_index[t["cams"][cam][0]] - t["cams"][cam][1] for t in ticks
                   if t["cams"].get(cam) is not None and t["cams"][cam][0] in by_index}
        assert len(offsets) == 1
    assert info["stats"]["frames_lost"] == sum(lost.values())
    assert info["stats"]["encoded"] == info["stats"]["frames"]  # the writer encoded each


def test_all_mode_exports_a_video_of_each_ticks_own_frame(all_run, tmp_path):
    path, msgs, _ = all_run
    summary = export_lerobot([path], tmp_path / "ds")
    assert summary.cameras == ["top", "wrist"]
    ticks = _ticks(msgs)
    for cam, (h, w) in SIZES.items():
        frames = {m.record["frame_index"]: _img(m.record).astype(int)
                  for m in msgs if m.topic == f"/camera/{cam}"}
        video = cv2.VideoCapture(
            str(tmp_path / f"ds/videos/observation.images.{cam}/chunk-000/file-000.mp4"))
        own = nearest = 0
        for t in ticks:
            ok, img = video.read()
            assert ok and img.shape == (h, w, 3)
            i = t["cams"][cam][0] if t["cams"].get(cam) else None
            if i not in frames:
                continue  # lost from its ring (counted, the test above)
            # the tick's own frame (re-encoded as MPEG-4: near, not equal), nearer to it
            # than to the frames just before and after it
            d = {k: np.abs(img.astype(int) - frames[k]).mean() for k in (i - 1, i, i + 1)
                 if k in frames}
            own += 1
            nearest += d[i] < 8 and d[i] <= min(d.values())
        assert not video.read()[0]  # one video frame per tick
        # a picture per tick, not one per upload (~every 7 ticks in "policy" mode)
        assert own >= 0.9 * len(ticks) and nearest >= 0.95 * own, (cam, own, nearest)


def test_all_mode_replays_and_shows(all_run, capsys):
    path, _, _ = all_run
    outcome = replay(path)
    assert outcome.match and outcome.targets > 30
    assert show_main([str(path)]) == 0
    assert "frame wrist #" in capsys.readouterr().out
    assert show_main([str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown  # frames without their bytes, as ever
