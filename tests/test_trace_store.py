"""The trace store: every channel round-trips exactly, drops are counted and recorded,
episodes and the session file are closed cleanly, and Foxglove's own reader agrees."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest
from mcap.reader import make_reader
from trace_util import CONFIG, GateSink, every_kind, only_run, same, tick

from robotd.trace import codec
from robotd.trace.reader import read_all
from robotd.trace.rundir import RUN_JSON, SESSION, is_run_name
from robotd.trace.schemas import CHANNELS, EPISODE_END, EPISODE_START, TRACE_DROP
from robotd.trace.store import TraceStore


def test_every_channel_round_trips_exactly(tmp_path):
    rng = np.random.default_rng(1)
    kinds = every_kind(rng)
    jpeg = bytes(rng.integers(0, 256, 5000, dtype=np.uint8))
    store = TraceStore(tmp_path, 1 << 30, CONFIG)
    ep = store.begin_episode(3, "w1", "stack the cups")
    t0 = time.time_ns()
    for i, (channel, record) in enumerate(kinds):
        assert ep.write(channel, t0 + i, record)
    assert ep.frame("wrist", t0 + 99, jpeg, 1234)
    ep.end("stopped", {"success": True, "notes": "clean"})
    store.close()

    path = only_run(tmp_path) / "episode-000003.mcap"
    msgs, reader = read_all(path)
    assert reader.status.complete and not reader.status.torn and reader.status.bad_messages == 0
    body = [m for m in msgs if m.topic != "/events" or m.record["name"] not in
            (EPISODE_START, EPISODE_END)]
    assert [m.topic for m in body] == [c for c, _ in kinds] + ["/camera/wrist"]
    for (channel, record), got in zip(kinds, body, strict=False):
        assert same(record, got.record), channel
    rows = np.asarray(body[2].record["rows"], dtype=np.float64)
    assert rows.tobytes() == kinds[2][1]["rows"].tobytes()  # float64 bit for bit
    frame = body[-1]
    assert codec.frame_bytes(frame.record) == jpeg
    assert frame.record["frame_id"] == "wrist" and frame.record["frame_index"] == 1234
    assert frame.record["timestamp"] == {"sec": (t0 + 99) // 10**9, "nsec": (t0 + 99) % 10**9}
    assert reader.episode["episode"] == 3 and reader.episode["task"] == "stack the cups"
    assert reader.episode["hz"] == 30.0 and reader.episode["joints"] == CONFIG["joints"]["names"]
    assert reader.end["outcome"] == "stopped" and reader.end["verdict"]["success"] is True


def test_foxglove_reader_validates_the_crcs_and_schemas(tmp_path):
    store = TraceStore(tmp_path, 1 << 30, CONFIG, flush_bytes=4096)
    ep = store.begin_episode(1, "w1", None)
    for s in range(500):
        ep.write("/robot/tick", 1_000 + s, tick(s))
    ep.end("max_steps")
    store.close()
    with open(only_run(tmp_path) / "episode-000001.mcap", "rb") as f:
        reader = make_reader(f, validate_crcs=True)
        summary = reader.get_summary()
        assert summary.statistics.chunk_count > 1  # flushed in several chunks
        topics = {c.topic: summary.schemas[c.schema_id] for c in summary.channels.values()}
        assert topics["/robot/tick"].encoding == "jsonschema"
        assert json.loads(topics["/robot/tick"].data) == CHANNELS["/robot/tick"].schema
        ticks = [json.loads(m.data) for _, c, m in reader.iter_messages(topics=["/robot/tick"])]
    assert [t["s"] for t in ticks] == list(range(500))


def test_run_directory_and_session_file(tmp_path):
    store = TraceStore(tmp_path, 1 << 30, CONFIG)
    run = store.run_dir
    assert run is not None and is_run_name(run.name)
    info = json.loads((run / RUN_JSON).read_text())
    assert info["config"] == CONFIG and info["ended"] is None and info["python"].startswith("3.")
    store.write("/operator", 5, {"cmd": "clear_fault", "args": {}, "ok": True, "error": None})
    ep = store.begin_episode(1, "w1", "t")
    store.write("/robot/tick", 6, tick(0))  # routed to the open episode
    ep.end("stopped")
    store.write("/link", 7, {"kind": "reconnect", "detail": {}})
    store.verdict(1, {"success": False, "notes": "dropped it"})
    store.close()
    session, _ = read_all(run / SESSION)
    assert [m.topic for m in session] == ["/operator", "/link", "/events"]
    assert session[-1].record["name"] == "verdict"
    side = json.loads((run / "episode-000001.json").read_text())
    assert side["outcome"] == "stopped" and side["verdict"]["notes"] == "dropped it"
    assert side["ticks"] == 1 and side["worker_episodes"] == ["w1"]
    ended = json.loads((run / RUN_JSON).read_text())
    assert ended["ended"] is not None and ended["stats"]["records"] == 3


def test_close_ends_the_open_episode_and_a_new_begin_supersedes(tmp_path):
    store = TraceStore(tmp_path, 1 << 30, CONFIG)
    store.begin_episode(1, "w1", None).write("/robot/tick", 1, tick(0))
    store.begin_episode(2, "w1", None).write("/robot/tick", 2, tick(0))
    store.close()
    run = only_run(tmp_path)
    outcomes = {}
    for n in (1, 2):
        _, reader = read_all(run / f"episode-00000{n}.mcap")
        assert reader.status.complete
        outcomes[n] = reader.end["outcome"]
    assert outcomes == {1: "superseded", 2: "daemon_stopped"}


def test_ticks_decimated_by_option(tmp_path):
    store = TraceStore(tmp_path, 1 << 30, CONFIG, tick_every=4)
    ep = store.begin_episode(1, "w1", None)
    for s in range(10):
        ep.write("/robot/tick", s, tick(s))
    ep.write("/policy/ask", 11, {"id": 1, "wep": "w1", "s": 9, "queue": 0, "delay": 1})
    ep.end("stopped")
    store.close()
    msgs, reader = read_all(only_run(tmp_path) / "episode-000001.mcap", ["/robot/tick"])
    assert [m.record["s"] for m in msgs] == [0, 4, 8]
    assert reader.episode["tick_every"] == 4


def test_full_queue_drops_count_and_are_recorded(tmp_path):
    sink = GateSink()
    store = TraceStore(tmp_path, 1 << 30, CONFIG, queue_records=16, queue_bytes=1 << 20,
                       live=sink)
    sink.gate.clear()
    ep = store.begin_episode(1, "w1", None)
    assert sink.entered.wait(10)  # the writer thread is stalled publishing episode_start
    results = [ep.write("/robot/tick", s, tick(s)) for s in range(1, 41)]
    frame_ok = ep.frame("top", 50, b"x" * (2 << 20), 1)  # over queue_bytes
    assert results == [True] * 16 + [False] * 24 and frame_ok is False
    stats = store.stats()
    assert (stats.dropped_records, stats.dropped_frames) == (24, 1)
    sink.gate.set()
    ep.end("stopped")
    store.close()
    msgs, _ = read_all(only_run(tmp_path) / "episode-000001.mcap")
    assert [m.record["s"] for m in msgs if m.topic == "/robot/tick"] == list(range(1, 17))
    drops = [m.record for m in msgs if m.topic == "/events" and m.record["name"] == TRACE_DROP]
    assert drops == [{"name": TRACE_DROP, "tick": None,
                      "detail": {"records": 24, "frames": 1, "total_records": 24,
                                 "total_frames": 1}}]
    assert sink.closed and any(t == "/robot/tick" for t, _, _ in sink.seen)


def test_bad_records_are_counted_never_raised_and_bad_channels_refused(tmp_path, caplog):
    store = TraceStore(tmp_path, 1 << 30, CONFIG)
    ep = store.begin_episode(1, "w1", None)
    with caplog.at_level(logging.ERROR, "robotd.trace"):
        assert ep.write("/events", 1, {"name": "x", "tick": 1, "detail": {"obj": object()}})
        assert ep.write("/events", 2, ["not", "an", "object"])
        ep.write("/robot/tick", 3, tick(0))
        assert store.flush()
    with pytest.raises(ValueError, match="no channel"):
        ep.write("/nope", 4, {})
    with pytest.raises(ValueError, match="camera name"):
        ep.frame("../etc", 5, b"", 0)
    with pytest.raises(ValueError, match="episode"):
        store.begin_episode(-1, "w", None)
    assert store.stats().errors == 2
    assert "cannot encode" in caplog.text
    ep.end("stopped")
    store.close()
    msgs, _ = read_all(only_run(tmp_path) / "episode-000001.mcap", ["/robot/tick"])
    assert len(msgs) == 1


def test_live_only_store_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sink = GateSink()
    store = TraceStore(None, 1 << 30, CONFIG, live=sink)
    ep = store.begin_episode(1, "w1", None)
    ep.write("/robot/tick", 1, tick(0))
    ep.end("stopped")
    store.close()
    assert list(tmp_path.iterdir()) == []
    assert [t for t, _, _ in sink.seen] == ["/events", "/robot/tick", "/events"]
