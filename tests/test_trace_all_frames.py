"""``trace.frames = "all"`` in the recorder, with real camera rings (robotd.shm), a real
trace store and real JPEG: every frame each camera captured, once, at the camera's own
resolution; frames the ring overwrote (before or during the read) skipped and counted, never
raised; the policy's copies not recorded twice; the export's pairing of ticks and frames by
the index each tick referenced; the setting itself strict."""

from __future__ import annotations

import itertools

import cv2
import numpy as np
import pytest

from robotd.config import load_config
from robotd.errors import ConfigError
from robotd.lane.messages import Event, Step
from robotd.runtime.recorder import Recorder
from robotd.shm import FrameRing
from robotd.trace.codec import frame_bytes
from robotd.trace.reader import read_all
from robotd.trace.store import TraceStore
from robotd.trace.video import frames_at_ticks

CONFIG = {"control": {"hz": 30.0}, "joints": {"names": ["a"]}}
OFFSET = 10**18
SHAPE = (48, 64, 3)
_names = itertools.count()


def _picture(i: int) -> np.ndarray:
    img = np.full(SHAPE, 30, np.uint8)
    img[:, (i * 5) % 60 : (i * 5) % 60 + 4] = (250, 60, 20)  # a bar that moves with i
    return img


@pytest.fixture
def ring():
    r = FrameRing.create(f"robotd-test-allframes-{_names.__next__()}", SHAPE, 4)
    yield r
    r.close()
    r.unlink()


def _recorder(tmp_path, rings, **store_kw) -> Recorder:
    store = TraceStore(tmp_path, 1 << 30, CONFIG, **store_kw)
    rec = Recorder(store, clock=lambda: 5_000, wall_offset_ns=OFFSET, frames="all")
    rec.read_rings(rings)
    rec.feed(Event("episode_start", 1, {"episode": 1, "wep": "w-1"}))
    return rec


def _step(s: int, ref: tuple[int, int] | None) -> Step:
    return Step(1, "w-1", s, 1_000_000 * (s + 1), [0.0], [0.0], {"top": ref}, True,
                target=[0.0], tick=s + 1)


def _write(ring: FrameRing, i: int) -> tuple[int, int]:
    t = 1_000_000 * i + 500
    return ring.write(_picture(i), t), t


def _frames(rec: Recorder):
    rec.store.close()
    assert rec.store.run_dir is not None
    msgs, reader = read_all(rec.store.run_dir / "episode-000001.mcap")
    assert reader.status.complete
    return msgs


def _decoded(record) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(frame_bytes(record), np.uint8), cv2.IMREAD_COLOR)
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def test_every_new_frame_is_recorded_once_at_its_capture_time(tmp_path, ring):
    rec = _recorder(tmp_path, {"top": ring})
    refs = []
    for s in range(6):
        refs.append(_write(ring, s))
        rec.feed(_step(s, refs[-1]))
        rec.feed(_step(s, refs[-1]))  # the same frame at the next tick: recorded once
    # a jpeg the uplink posted for a step: the ring's copy is the one recorded, not this
    rec.posted("w-1", 0, {"top": {"codec": "jpeg", "data": b"\xff\xd8not-this"}}, {})
    msgs = _frames(rec)
    frames = [m for m in msgs if m.topic == "/camera/top"]
    assert [m.record["frame_index"] for m in frames] == [i for i, _ in refs]
    for m, (i, t) in zip(frames, refs):
        assert m.log_time == OFFSET + t  # at its capture time, on the ticks' clock
        assert np.abs(_decoded(m.record).astype(int) - _picture(i)).mean() < 4
    assert rec.store.stats().frames_lost == 0 and rec.store.stats().encoded == 6


def test_frames_the_ring_overwrote_are_skipped_and_counted(tmp_path, ring):
    rec = _recorder(tmp_path, {"top": ring})
    rec.feed(_step(0, _write(ring, 0)))
    for i in range(1, 10):  # the main process fell behind by more than the ring holds
        ref = _write(ring, i)
    rec.feed(_step(1, ref))  # frames 1..5 are gone (4 slots: 6..9 still there)
    rec.feed(Event("episode_end", 3, {"outcome": "stopped"}))
    msgs = _frames(rec)
    assert [m.record["frame_index"] for m in msgs if m.topic == "/camera/top"] == [0, 6, 7, 8, 9]
    (lost,) = [m.record for m in msgs if m.record.get("name") == "frames_lost"]
    assert lost["detail"] == {"frames": 5, "total": 5, "cameras": {"top": 5}}
    assert rec.store.stats().frames_lost == 5


class TornRing(FrameRing):
    """A ring whose writer laps the slot being copied (the camera wrote on meanwhile)."""

    def _copy_slot(self, slot: int, out: np.ndarray) -> None:
        super()._copy_slot(slot, out)
        if self.tear:
            for _ in range(self.slots):
                self.write(_picture(99), 1)


def test_a_frame_torn_while_read_is_skipped_never_raised(tmp_path):
    ring = TornRing.create(f"robotd-test-allframes-torn-{next(_names)}", SHAPE, 4)
    try:
        ring.tear = False
        rec = _recorder(tmp_path, {"top": ring})
        rec.feed(_step(0, _write(ring, 0)))
        ring.tear = True
        rec.feed(_step(1, _write(ring, 1)))  # read while the writer laps it: refused
        ring.tear = False
        ring.close()  # a ring closed under the recorder: lost too, and not an exception
        rec.feed(_step(2, (7, 123)))
        msgs = _frames(rec)
    finally:
        ring.unlink()
    assert [m.record["frame_index"] for m in msgs if m.topic == "/camera/top"] == [0]
    # frame 1 torn; then 2..7: 2 and 3 older than the ring holds, 4..7 unreadable
    assert rec.store.stats().frames_lost == 1 + 6
    assert sum(m.topic == "/robot/tick" for m in msgs) == 3  # the ticks all recorded


def test_a_full_writer_queue_drops_frames_counted_as_any_drop(tmp_path, ring):
    big = FrameRing.create(f"robotd-test-allframes-big-{next(_names)}", (1024, 1024, 3), 8)
    try:
        rec = _recorder(tmp_path, {"top": big}, queue_bytes=1 << 20)  # room for no frame
        for s in range(4):
            rec.feed(_step(s, (big.write(np.zeros(big.shape, np.uint8), 10 + s), 10 + s)))
        msgs = _frames(rec)
    finally:
        big.close()
        big.unlink()
    stats = rec.store.stats()
    assert stats.dropped_frames == 4 and stats.frames_lost == 0
    drops = [m.record["detail"] for m in msgs if m.record.get("name") == "trace_drop"]
    assert sum(d["frames"] for d in drops) == 4 and all(d["records"] == 0 for d in drops)


def test_policy_mode_records_no_ring_frames(tmp_path, ring):
    store = TraceStore(tmp_path, 1 << 30, CONFIG)
    rec = Recorder(store, clock=lambda: 5_000, wall_offset_ns=OFFSET)  # "policy"
    rec.read_rings({"top": ring})
    rec.feed(Event("episode_start", 1, {"episode": 1, "wep": "w-1"}))
    for s in range(3):
        rec.feed(_step(s, _write(ring, s)))
    rec.inlined("w-1", 1, {"top": _picture(1)})
    msgs = _frames(rec)
    assert [m.record["frame_index"] for m in msgs if m.topic == "/camera/top"] == [1]


@pytest.mark.parametrize(("text", "want"), [
    ('"all"', "all"), ('"policy"', "policy"), ("true", "policy"), ("false", False),
])
def test_trace_frames_takes_a_mode_or_a_bool(text, want):
    assert load_config(overrides=[f"trace.frames={text}"]).trace.frames == want


def test_every_frame_is_recorded_by_default():  # recordings are training data
    assert load_config(overrides=[]).trace.frames == "all"


@pytest.mark.parametrize("text", ['"true"', "1", "0", '"none"', '"every"'])
def test_trace_frames_refuses_anything_else(text):
    with pytest.raises(ConfigError, match=r"trace\.frames"):
        load_config(overrides=[f"trace.frames={text}"])


@pytest.mark.parametrize("text", ["true", "0", "101", "85.0"])
def test_trace_frame_quality_is_a_whole_number_1_to_100(text):
    with pytest.raises(ConfigError, match=r"trace\.frame_quality"):
        load_config(overrides=[f"trace.frame_quality={text}"])


def _png(value: int) -> bytes:
    return cv2.imencode(".png", np.full((4, 4, 3), value, np.uint8))[1].tobytes()


def test_the_export_pairs_each_tick_with_the_frame_it_referenced():
    # frame 2 was captured (t=95) before tick 1's time (100) but committed after the lane
    # read its ring: tick 1 referenced frame 1, and shows it; frame 3 was captured after
    # tick 2's time (a capture time stamped late) yet is the one tick 2 read
    frames = [(0, _png(10), 1), (95, _png(20), 2), (205, _png(30), 3), (150, _png(5), 0)]
    shown = frames_at_ticks(frames, np.array([50, 100, 200, 300]), np.array([1, 1, 3, 3]))
    assert [int(img[0, 0, 0]) for img in shown] == [10, 10, 30, 30]  # never back to frame 0
    # without references (an older trace): by capture time, as before
    by_time = frames_at_ticks(frames[:3], np.array([50, 100, 200, 300]))
    assert [int(img[0, 0, 0]) for img in by_time] == [10, 20, 20, 30]


def test_a_drop_after_a_queued_begin_is_never_filed_before_it(tmp_path):
    """The writer's drain ends just as the event loop queues an episode's begin and then
    drops a frame: the drop is the episode's, and no file gets a negative count. The writer
    is driven by hand (not started) to take that order exactly."""
    from robotd.trace.outbox import Outbox
    from robotd.trace.writer import WriterSettings, WriterThread

    outbox = Outbox(16, 1 << 20)
    writer = WriterThread(outbox, None, WriterSettings(), None)
    noted: list[tuple[int | None, dict]] = []
    writer._event = lambda target, name, detail, t=None, tick=None: noted.append(  # type: ignore[method-assign]
        (writer.current, detail))
    outbox.put_control(("verdict", 1, {}))  # a control item queued, not yet taken
    outbox.dropped_frames += 1  # a frame dropped after it was queued
    writer._note_drops(writer._drops_before_next_control())  # the end of a drain
    assert noted == []  # not filed before the item that came first
    outbox.take()
    writer._note_drops(outbox.control_marks.popleft())  # the item: nothing before it
    writer._note_drops(writer._drops_before_next_control())
    assert [d["frames"] for _, d in noted] == [1]


def test_a_frame_the_queue_has_no_room_for_is_never_copied_out(tmp_path):
    big = FrameRing.create(f"robotd-test-allframes-room-{next(_names)}", (1024, 1024, 3), 8)

    class Counted:  # the real ring, its reads counted
        slots, shape, reads = big.slots, big.shape, 0

        def read(self, index):
            Counted.reads += 1
            return big.read(index)

    try:
        rec = _recorder(tmp_path, {"top": Counted()}, queue_bytes=1 << 20)  # room for none
        first = big.write(np.zeros(big.shape, np.uint8), 10)
        rec.feed(_step(0, (first, 10)))
        for s in range(1, 8):  # a catch-up: 7 frames at once, as after a stall
            last = big.write(np.zeros(big.shape, np.uint8), 10 + s)
        rec.feed(_step(1, (last, 17)))
        rec.store.close()
    finally:
        big.close()
        big.unlink()
    assert Counted.reads == 0 and rec.store.stats().dropped_frames == 8
