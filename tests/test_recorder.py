"""The recorder's mapping: every lane message, chunk sent down, operator command, link event
and posted frame lands on its channel of a real trace store, read back as it went in."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from robotd.lane.messages import (
    Ask,
    ChunkRows,
    Event,
    Merged,
    Rows,
    Rtc,
    StartState,
    Step,
)
from robotd.runtime.recorder import Recorder
from robotd.trace.codec import frame_bytes
from robotd.trace.reader import read_all
from robotd.trace.store import TraceStore
from tests.test_lane import UP

CONFIG = {"control": {"hz": 30.0}, "joints": {"names": ["a", "b", "c"]}}
STATS = next(m for m in UP if type(m).__name__ == "Stats")


def _step(s: int, wep: str = "r-1", cams=None, tick: int = 0) -> Step:
    return Step(1, wep, s, 1_000 + s, [0.1 * s, -0.0, 1e-300], [0.5, 0.25, 0.0],
                cams if cams is not None else {"top": (40 + s, 900 + s)}, True,
                target=[0.1 * s + 0.01, 0.0, 1.0], shield="clipped" if s == 2 else "",
                tick=tick or 10 + s)


@pytest.fixture
def rec(tmp_path):
    store = TraceStore(tmp_path, 1 << 30, CONFIG)
    r = Recorder(store, clock=lambda: 5_000, wall_offset_ns=10**18)
    yield r
    store.close()


def _episode(r: Recorder) -> None:
    start = StartState(1, "r-1", "r", 1, 9, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], 0, 0, 0, 8,
                       True, True, 0, 0, "pick the cube")
    r.feed(start)
    r.feed(Event("episode_start", 9, {"episode": 1, "wep": "r-1"}))


def _read(r: Recorder, name: str = "episode-000001.mcap"):
    r.store.close()
    assert r.store.run_dir is not None
    return read_all(r.store.run_dir / name)


def test_every_lane_message_lands_on_its_channel(rec):
    _episode(rec)
    for s in range(3):
        rec.feed(_step(s))
    rec.feed(Ask(1, "r-1", 0, 1, 0, Rtc(3, Rows.of(np.ones((2, 3))))))
    rows = np.random.default_rng(3).normal(size=(5, 3))
    rec.sent(ChunkRows(1, "r-1", 0, Rows.of(rows)))
    rec.feed(Merged(1, "r-1", 0, 2, 5, 2, False))
    rec.sent(ChunkRows(2, "r-1", 2, Rows.of(rows[:2, :2])))
    rec.feed(Event("bad_chunk", 13, {"ask": 2, "error": "rows of shape [2, 2]"}))
    rec.sent(ChunkRows(1, "r-1", 0, Rows.of(rows)))  # answered twice: the lane discards it
    rec.feed(Event("chunk_discarded", 14, {"ask": 1, "reason": "not the act in flight"}))
    rec.feed(Event("episode_reset", 15, {"cause": "copy died", "old_wep": "r-1",
                                         "new_wep": "r-2", "flushed": 3}))
    rec.feed(STATS)  # its dropped_messages: 0, nothing to say
    rec.feed(Event("episode_end", 20, {"episode": 1, "wep": "r-2", "outcome": "stopped",
                                       "cause": "", "steps": 3, "flushed": 0}))
    msgs, reader = _read(rec)
    by = lambda topic: [m.record for m in msgs if m.topic == topic]  # noqa: E731
    ticks = by("/robot/tick")
    assert [t["s"] for t in ticks] == [0, 1, 2] and ticks[1]["cams"] == {"top": [41, 901]}
    assert ticks[2]["shield"] == "clipped" and ticks[0]["pos"][2] == 1e-300
    assert ticks[0]["tick"] == 10 and msgs[[m.topic for m in msgs].index("/robot/tick")].log_time \
        == 10**18 + 1_000
    assert by("/policy/ask") == [{"id": 1, "wep": "r-1", "s": 0, "queue": 0, "delay": 3,
                                  "frozen": 2}]
    merged, bad, discarded = by("/policy/chunk")
    assert np.asarray(merged["rows"]).tobytes() == rows.tobytes()
    assert (merged["result"], merged["at"], merged["dropped"]) == ("merged", 2, 2)
    assert (bad["result"], bad["tick"], bad["at"], len(bad["rows"][0])) == ("bad", 13, None, 2)
    assert discarded["result"] == "discarded"
    (start,) = by("/robot/start_state")
    assert start["task"] == "pick the cube" and start["open_loop_horizon"] == 8
    events = by("/events")
    assert events[0]["name"] == "episode_start" and events[0]["tick"] == 9
    assert events[-1]["name"] == "episode_end" and events[-1]["tick"] == 20
    assert events[-1]["detail"]["outcome"] == "stopped" and events[-1]["detail"]["flushed"] == 0
    (reset,) = by("/link")
    assert reset["kind"] == "episode_reset" and reset["detail"]["new_wep"] == "r-2"
    assert reader.episode["task"] == "pick the cube" and reader.end["outcome"] == "stopped"


def test_operator_commands_verdicts_and_lane_drops(rec):
    rec.operator("status", {}, None, {"state": "IDLE"})  # polled: not recorded
    _episode(rec)
    rec.operator("start", {"task": "x"}, "bad_state: start needs IDLE")
    drops = type(STATS)(**{f: getattr(STATS, f) for f in STATS.__struct_fields__})
    drops.dropped_messages = 7
    rec.feed(drops)
    rec.feed(Event("episode_end", 20, {"episode": 1, "wep": "r-1", "outcome": "stopped"}))
    rec.operator("verdict", {"success": True, "notes": "clean"}, None,
                 {"episode": 1, "success": True, "notes": "clean", "time": 1.0})
    rec.link("reconnect", cause="local worker killed by SIGKILL")
    msgs, _ = _read(rec)
    ops = [m.record for m in msgs if m.topic == "/operator"]
    assert ops == [{"cmd": "start", "args": {"task": "x"}, "ok": False,
                    "error": "bad_state: start needs IDLE"}]
    drop = next(m.record for m in msgs if m.topic == "/events" and m.record["name"] == "lane_drop")
    assert drop["detail"] == {"messages": 7, "total": 7}
    side = json.loads((rec.store.run_dir / "episode-000001.json").read_text())
    assert side["verdict"] == {"success": True, "notes": "clean"}
    session, _ = read_all(rec.store.run_dir / "session.mcap")
    kinds = [(m.topic, m.record.get("cmd") or m.record.get("kind")) for m in session]
    assert ("/operator", "verdict") in kinds and ("/link", "reconnect") in kinds


def _picture(h: int, w: int) -> np.ndarray:
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = np.linspace(20, 220, w, dtype=np.uint8)[None, :, None]
    img[h // 4 : h // 2, w // 4 : w // 2] = (255, 40, 10)
    return img


def test_posted_frames_are_recorded_once_jpeg_reused_raw_encoded(rec):
    _episode(rec)
    rec.feed(_step(0, cams={"top": (7, 700), "wrist": (3, 690)}))
    rec.feed(_step(1, cams={"top": (8, 733), "wrist": (3, 690)}))
    jpeg = cv2.imencode(".jpg", _picture(60, 80))[1].tobytes()
    raw = _picture(48, 64)
    rec.posted("r-1", 0, {"top": {"codec": "jpeg", "shape": [60, 80, 3], "data": jpeg},
                          "wrist": {"codec": "raw", "shape": [48, 64, 3], "data": raw}},
               {"joints.pos": np.zeros(3)})
    # step 1's wrist frame is the same frame (index 3) as step 0's: recorded once
    rec.posted("r-1", 1, {"wrist": {"codec": "raw", "shape": [48, 64, 3], "data": raw}}, {})
    rec.posted("r-1", 99, {"top": {"codec": "jpeg", "shape": [1, 1, 3], "data": b"x"}}, {})
    rec.refused("r-1", 1, ["wrist"])
    msgs, _ = _read(rec)
    frames = {m.topic: m for m in msgs if m.topic.startswith("/camera/")}
    assert set(frames) == {"/camera/top", "/camera/wrist"}
    assert sum(m.topic.startswith("/camera/") for m in msgs) == 2
    top, wrist = frames["/camera/top"], frames["/camera/wrist"]
    assert frame_bytes(top.record) == jpeg and top.record["frame_index"] == 7
    assert top.log_time == 10**18 + 700  # its capture time
    back = cv2.cvtColor(cv2.imdecode(np.frombuffer(frame_bytes(wrist.record), np.uint8),
                                     cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    assert wrist.record["format"] == "jpeg" and back.shape == raw.shape
    assert np.abs(back.astype(int) - raw).mean() < 4  # the same picture, JPEG-encoded
    links = [m.record for m in msgs if m.topic == "/link"]
    assert [lk["kind"] for lk in links] == ["upload", "upload", "upload", "refusal"]
    assert links[0]["detail"] == {"wep": "r-1", "step": 0, "keys": ["joints.pos", "top", "wrist"],
                                  "frames": 2, "bytes": len(jpeg) + raw.nbytes}
    assert links[3]["detail"] == {"wep": "r-1", "step": 1, "keys": ["wrist"]}


def test_without_frames_nothing_of_the_pictures_is_kept(tmp_path: Path):
    store = TraceStore(tmp_path, 1 << 30, CONFIG, frames=False)
    r = Recorder(store)
    _episode(r)
    r.feed(_step(0))
    r.posted("r-1", 0, {"top": {"codec": "raw", "shape": [4, 4, 3],
                                "data": np.zeros((4, 4, 3), np.uint8)}}, {})
    msgs, _ = _read(r)
    assert not any(m.topic.startswith("/camera/") for m in msgs)
    assert [m.topic for m in msgs].count("/link") == 1


def test_a_trace_that_cannot_be_opened_is_logged_and_the_daemon_goes_on(tmp_path, caplog):
    from robotd.config import load_config
    from robotd.runtime.recorder import open_recorder

    (tmp_path / "file").write_text("not a directory")
    cfg = load_config(None, [f'trace.dir="{tmp_path / "file" / "traces"}"'])
    assert open_recorder(cfg) is None
    assert "cannot open the trace store" in caplog.text and "running without a trace" in caplog.text
    assert open_recorder(load_config(None, ["trace.enabled=false"])) is None  # nothing wanted
