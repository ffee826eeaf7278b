"""The lane between the processes: every message round-trips, every malformed one is refused
with a named reason while the lane keeps ticking, and the wall-clock tick plays exactly what
the virtual runner plays for the same arrival schedule. Real sockets, a real ControlLane."""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from robotd.config import load_config
from robotd.contract import Actions, Observations, Stream
from robotd.control.counters import Counters, QueueCounters, ShieldCounters
from robotd.control.histogram import LatencyHistogram
from robotd.lane import codec
from robotd.lane.messages import (
    ActFailed,
    Ask,
    Bye,
    ChunkRows,
    Command,
    Contract,
    EpisodeLost,
    Estop,
    Event,
    Fault,
    Merged,
    Ready,
    Reply,
    Rows,
    Rtc,
    Shutdown,
    StartState,
    Stats,
    Status,
    Step,
)
from robotd.virtual.runner import run_virtual
from tests.lane_util import LaneRig, wait_in_socket

STATUS = Status("FAULT", 2, "w-1", 7, "", Fault("estop", "operator", False), 3, True, False)
HIST = LatencyHistogram()
HIST.add(12_345)

DOWN = [
    ChunkRows(4, "w-1", 9, Rows.of(np.arange(6.0).reshape(2, 3))),
    Command(1, "start", task="pick the red cube"),
    Command(2, "estop", reason="hand in the way"),
    ActFailed(4, "act failed: TimeoutError"),
    EpisodeLost("copy killed by SIGKILL"),
    Contract(8),
    Contract(None),
    Contract(None, rtc=True),
    Shutdown(),
]
UP = [
    Step(1, "w-1", 3, 99, [0.1, 0.2], [0.0, 0.0], {"top": (5, 98), "wrist": None}, True),
    Step(1, "w-1", 4, 99, [0.1], [0.0], {}, False, True, {"tracking_error": 0.1}, [0.3], True),
    Step(1, "w-1", 5, 99, [0.1], [0.0], {}, True, target=[0.2], shield="clamped", tick=42),
    Ask(4, "w-1", 9, 1, 2),
    Ask(5, "w-1", 9, 1, 2, Rtc(3, Rows.of(np.ones((2, 3))), Rows.of(np.zeros((1, 3))))),
    Ask(6, "w-1", 0, 1, 0, Rtc(1)),
    Merged(4, "w-1", 9, 12, 16, 3, False),
    Merged(4, "w-1", 9, 12, 16, 3, False, 7),
    StartState(2, "w-3", "w", 3, 41, [0.1, -0.0], [0.0, 5e-324], 1, 7, 44, 8, True, True, 0, 1,
               "pick the red cube"),
    StartState(1, "w-1", "w", 1, 0, None, None, 0, 0, 0, None, True, False, 2, 0),
    StartState(3, "w-4", "w", 4, 90, [0.0], [0.0], 0, 9, 0, None, True, True, 0, 0, "",
               True, [3, 4, 3, 5]),
    STATUS,
    Stats(
        Counters(ticks=5),
        QueueCounters(),
        ShieldCounters(per_joint={"elbow": 2}),
        HIST.data(),
        HIST.data(),
        {3: 2},
        HIST.data(),
        1,
        2,
        3.5,
        0,
        {"elbow": {"timeouts": 1}},
        STATUS,
    ),
    Reply(1, True, STATUS),
    Reply(None, False, None, "bad_state", "start needs IDLE"),
    Event("fault", 12, {"cause": "estop", "active": False, "n": 3, "x": 0.5, "none": None}),
    Ready(123, ["SCHED_FIFO not permitted"]),
    Bye(),
]


@pytest.mark.parametrize("msg", DOWN, ids=lambda m: type(m).__name__)
def test_every_down_message_round_trips(msg: Any) -> None:
    back = codec.decode_down(codec.encode(msg))
    assert back == msg and type(back) is type(msg)


@pytest.mark.parametrize("msg", UP, ids=lambda m: type(m).__name__)
def test_every_up_message_round_trips(msg: Any) -> None:
    back = codec.decode_up(codec.encode(msg))
    assert back == msg and type(back) is type(msg)
    assert codec.decode_up_batch(codec.encode_batch([msg, msg])) == [msg, msg]


def test_rows_round_trip_bit_for_bit() -> None:
    rows = np.random.default_rng(1).normal(size=(7, 5))
    back = codec.decode_down(codec.encode(ChunkRows(1, "w", 0, Rows.of(rows))))
    assert np.array_equal(back.rows.array(), rows)
    assert not back.rows.array().flags.writeable


def raw(obj: Any) -> bytes:
    return msgspec.msgpack.encode(obj)


MALFORMED = [
    (b"\xc1", "not msgpack"),
    (raw([1, 2]), "Expected `object`"),
    (raw({"k": "bogus"}), "Invalid value 'bogus'"),
    (raw({"k": "cmd", "cmd": "start"}), "missing required field `id`"),
    (raw({"k": "cmd", "id": "one", "cmd": "start"}), "Expected `int`, got `str` - at `$.id`"),
    (raw({"k": "cmd", "id": 1, "cmd": "self_destruct"}), "at `$.cmd`"),
    (raw({"k": "cmd", "id": 1, "cmd": "start", "extra": 1}), "unknown field `extra`"),
    (raw({"k": "cmd", "id": 1, "cmd": "estop", "reason": "x" * 600}), "length <= 500"),
    (raw({"k": "rows", "ask": 1, "wep": "w", "s": -1, "rows": [1, 3, b""]}), "`$.s`"),
    (raw({"k": "rows", "ask": 1, "wep": "w", "s": 0, "rows": [10**6, 3, b""]}), "`$.rows[0]`"),
    (b"\x00" * (codec.MAX_MESSAGE_BYTES + 1), "exceeds the limit"),
]


@pytest.mark.parametrize(("data", "reason"), MALFORMED)
def test_malformed_down_messages_are_refused_with_a_named_reason(data: bytes, reason: str) -> None:
    with pytest.raises(codec.LaneError, match=None) as info:
        codec.decode_down(data)
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("rtc", "reason"),
    [
        ({"delay": 0}, "`$.rtc.delay`"),
        ({"delay": 5000}, "`$.rtc.delay`"),
        ({"delay": 2, "prefix": [0, 3, b""]}, "`$.rtc.prefix[0]`"),
        ({"delay": 2, "frozen": 1}, "unknown field `frozen`"),
    ],
)
def test_malformed_rtc_of_an_ask_is_refused_with_a_named_reason(rtc: dict, reason: str) -> None:
    msg = {"k": "ask", "id": 1, "wep": "w", "s": 0, "ep": 1, "queue": 0, "rtc": rtc}
    with pytest.raises(codec.LaneError) as info:
        codec.decode_up(raw(msg))
    assert reason in str(info.value)


# ---- a real lane on real sockets ------------------------------------------------------------


@pytest.fixture
def rig() -> Iterator[LaneRig]:
    with tempfile.TemporaryDirectory(prefix="rbt-lane-") as tmp:
        r = LaneRig(Path(tmp), 'robot.start="idle"')
        yield r
        r.close()


def test_a_bad_message_is_an_event_and_the_lane_keeps_ticking(rig: LaneRig) -> None:
    rig.tick()
    for data, _ in MALFORMED:
        rig.down.send(data)
    got = []
    deadline = time.monotonic() + 20  # a 4 MiB message takes a while on a loaded machine
    while rig.lane.kernel.counters.bad_messages < len(MALFORMED):
        assert time.monotonic() < deadline, "the lane never saw every bad message"
        wait_in_socket(rig.lane.ports.down)
        got += rig.tick()
    bad = [m for m in got if m["k"] == "event" and m["name"] == "bad_message"]
    assert bad and "lane message" in bad[0]["error"]  # rate-limited to one a second
    assert rig.lane.kernel.counters.bad_messages == len(MALFORMED)
    ticks = rig.lane.kernel.counters.ticks
    rig.send(Command(9, "status"))
    wait_in_socket(rig.lane.ports.down)
    replies = [m for m in rig.tick() if m["k"] == "reply"]
    assert replies and replies[0]["id"] == 9 and replies[0]["ok"]
    assert rig.lane.kernel.counters.ticks == ticks + 1


def test_rows_whose_bytes_do_not_match_their_shape_are_refused(rig: LaneRig) -> None:
    rig.send(ChunkRows(1, "w", 0, Rows(2, 3, b"\x00" * 8)))
    wait_in_socket(rig.lane.ports.down)
    got = rig.tick()
    bad = [m for m in got if m["k"] == "event" and m["name"] == "bad_message"]
    assert "8 bytes for 2 x 3 float64" in bad[0]["error"]


def test_lane_sock_takes_the_estop_and_nothing_else(rig: LaneRig) -> None:
    rig.tick()
    rig.estop.send(codec.encode(Command(1, "start")))  # a command: not on this socket
    wait_in_socket(rig.lane.ports.estop)
    got = rig.tick()
    assert rig.estop.poll(2000)
    refused = codec.decode_up(rig.estop.recv())
    assert isinstance(refused, Reply) and not refused.ok and refused.code == "refused"
    assert [m["name"] for m in got if m["k"] == "event"] == ["lane_refused"]
    assert rig.lane.kernel.machine.state == "IDLE"
    rig.estop.send(codec.encode(Estop(5, "hand in the way")))
    wait_in_socket(rig.lane.ports.estop)
    got = rig.tick()
    assert rig.estop.poll(2000)
    ack = codec.decode_up(rig.estop.recv())
    assert isinstance(ack, Reply) and ack.ok and ack.id == 5 and ack.status.state == "FAULT"
    events = [m for m in got if m["k"] == "event"]
    assert [e["name"] for e in events] == ["fault", "lane_estop"]
    assert events[0]["cause"] == "estop" and events[1]["reason"] == "hand in the way"


# ---- one tick for both clocks ---------------------------------------------------------------


class Wave:
    """Rows depend on the step they are meant for only: row i of a chunk asked at s is a
    smooth function of s + i (so the merge, not the policy, decides what plays)."""

    observations = Observations(streams={"joints.pos": Stream()})
    actions = Actions(open_loop_horizon=12)

    def infer(self, inputs: dict[str, Any]) -> np.ndarray:
        return rows_for(inputs["steps"][-1])


def rows_for(s: int) -> np.ndarray:
    t = (s + np.arange(12, dtype=float)) / 30.0
    return np.stack([0.5 * np.sin(t), 0.4 * np.cos(0.7 * t) - 0.3, 0.5 + 0.4 * np.sin(2 * t)], 1)


@pytest.mark.parametrize("merge", ["replace", "fade", "ensemble"])
@pytest.mark.parametrize("latency_s", [0.05, 0.1, 0.2])
def test_the_wall_clock_tick_plays_what_the_virtual_runner_plays(
    merge: str, latency_s: float
) -> None:
    overrides = ['control.timing="realtime"', "control.refill_steps=6", f'control.merge="{merge}"']
    ticks = 150
    cfg = load_config(None, ["cameras={}", *overrides])
    virtual = run_virtual(cfg, Wave(), steps=ticks, latency_s=latency_s)
    delay = math.ceil(latency_s * cfg.control.hz - 1e-9)
    with tempfile.TemporaryDirectory(prefix="rbt-lane-") as tmp:
        rig = LaneRig(Path(tmp), *overrides)
        try:
            rig.send(Contract(12))  # the policy link is up: the sim's first episode starts
            wait_in_socket(rig.lane.ports.down)
            due: dict[int, list[ChunkRows]] = {}
            played = np.full((ticks, 3), np.nan)
            for i in range(ticks):
                for msg in due.pop(i, []):
                    rig.send(msg)
                    wait_in_socket(rig.lane.ports.down)
                got = rig.tick()
                if rig.lane.io.written is not None:
                    played[i] = rig.lane.io.written
                for ask in (m for m in got if m["k"] == "ask"):
                    rows = Rows.of(rows_for(ask["s"]))
                    due.setdefault(i + delay, []).append(
                        ChunkRows(ask["id"], ask["wep"], ask["s"], rows)
                    )
        finally:
            rig.close()
    assert virtual.counters["chunks"] > 5
    assert np.array_equal(played, virtual.played, equal_nan=True)


def test_an_estop_between_ticks_is_taken_at_once_not_at_the_next_tick(rig: LaneRig) -> None:
    """The loop's sleep watches lane.sock: the e-stop latches, a safe command is written and
    acknowledged during the sleep, before the next deadline."""
    import threading

    rig.tick()
    sleeping = threading.Event()
    done: list[int] = []

    def loop_sleep() -> None:
        sleeping.set()
        rig.lane.estops.sleep(2.0)  # a long period: the e-stop must not wait for its end
        done.append(time.monotonic_ns())

    t = threading.Thread(target=loop_sleep)
    t.start()
    assert sleeping.wait(5)
    rig.estop.send(codec.encode(Estop(7, "now")))
    assert rig.estop.poll(5000), "no acknowledgement"
    ack = codec.decode_up(rig.estop.recv())
    still_sleeping = not done  # taken while the loop slept, not after it
    t.join(10)
    assert still_sleeping and done
    assert isinstance(ack, Reply) and ack.ok and ack.id == 7
    assert ack.written_ns == rig.lane.io.done_ns and ack.status.state == "FAULT"
