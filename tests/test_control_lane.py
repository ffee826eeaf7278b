"""The control lane survives whatever its driver throws: it holds, reports and keeps ticking."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from robotd.config import load_config
from robotd.control.ports import ControlSpec
from robotd.control.process import ControlLane
from tests.lane_util import recv_all


@pytest.fixture
def lane(tmp_path):
    cfg = load_config(None, ["cameras={}", 'robot.start="idle"', "safety.driver_fault_run=3"])
    ctx = zmq.Context.instance()
    up = ctx.socket(zmq.PULL)
    up.bind(f"ipc://{tmp_path}/up.sock")
    spec = ControlSpec(
        config=cfg.model_dump(mode="json"),
        run_id="t",
        up=f"ipc://{tmp_path}/up.sock",
        down=f"ipc://{tmp_path}/down.sock",
        estop=f"ipc://{tmp_path}/lane.sock",
    )
    lane = ControlLane(spec)
    yield lane, up
    lane.close()
    up.close(linger=0)


def events(up) -> list[dict]:
    return [m for m in recv_all(up) if m["k"] == "event"]


def tick(lane: ControlLane) -> None:
    """One tick of the lane's I/O and what it emitted sent up (the loop's body, unclocked)."""
    lane.io.run(time.monotonic_ns())
    lane.flush()


def test_any_driver_exception_is_a_failed_read_not_a_dead_loop(lane):
    lane, up = lane
    tick(lane)
    held = lane.kernel.shield.last.copy()
    writes = []
    lane.driver.read = lambda: (_ for _ in ()).throw(OSError(5, "Input/output error"))
    lane.driver.write = lambda target: writes.append(np.array(target))
    for _ in range(3):
        tick(lane)
    got = events(up)
    errors = [e for e in got if e["name"] == "driver_error"]
    assert errors and errors[0]["op"] == "read" and "OSError" in errors[0]["error"]
    assert any(e["name"] == "fault" and e["cause"] == "driver" for e in got)
    assert writes and all(np.array_equal(w, held) for w in writes)  # held the last target


def test_a_write_that_raises_is_reported_and_the_next_tick_runs(lane):
    lane, up = lane

    def bad_write(target):
        raise ValueError("plugin bug")

    lane.driver.write = bad_write
    tick(lane)
    tick(lane)
    errors = [e for e in events(up) if e["name"] == "driver_error"]
    assert errors[0]["op"] == "write" and "ValueError: plugin bug" in errors[0]["error"]
    assert lane.kernel.counters.ticks == 2


def test_a_kernel_exception_holds_the_last_target(lane):
    lane, up = lane
    tick(lane)
    held = lane.kernel.shield.last.copy()
    writes = []
    lane.driver.write = lambda target: writes.append(np.array(target))

    def broken(*args, **kwargs):
        raise RuntimeError("bug")

    lane.kernel.update = broken
    tick(lane)
    assert np.array_equal(writes[-1], held)
    assert any(e["name"] == "kernel_error" for e in events(up))
