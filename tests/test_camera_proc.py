"""The real camera process, with a real ring and world in /dev/shm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from drivers.sim import geometry as g
from drivers.sim.world import WORLD_SUFFIX, SimWorld, world_name
from robotd.shm import SHM_DIR, FrameRing, unlink_prefix

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
W, H = 320, 240


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"robotd-test-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    yield p
    unlink_prefix(p)


@pytest.fixture
def shm(prefix: str) -> Iterator[tuple[FrameRing, SimWorld]]:
    ring = FrameRing.create(prefix + "top", (H, W, 3), 8)
    world = SimWorld.create(world_name(prefix), 3, time.monotonic_ns())  # as the sim arm does
    world.publish(np.array([0.3, 0.9, 0.0]), time.monotonic_ns())
    yield ring, world
    ring.close()
    world.close()


def spec(ring: FrameRing, world: SimWorld, /, **changes: object) -> str:
    base: dict[str, object] = {
        "name": "top",
        "driver": "sim",
        "width": W,
        "height": H,
        "fps": 50,
        "options": {"view": "top"},
        "ring": ring.name,
        "shm_prefix": world.name.removesuffix(WORLD_SUFFIX),
    }
    return json.dumps({**base, **changes})


def spawn(arg: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "robotd.runtime.camera_proc", arg],
        cwd=ROOT,
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_frames(ring: FrameRing, proc: subprocess.Popen[str], count: int) -> int:
    deadline = time.monotonic() + 20
    while True:
        latest = ring.latest()
        if latest is not None and latest[0] + 1 >= count:
            return latest[0]
        if proc.poll() is not None:
            pytest.fail(f"camera process exited {proc.returncode}: {proc.stderr.read()}")
        assert time.monotonic() < deadline, "no frames from the camera process"
        time.sleep(0.005)


def assert_shows_the_dot(ring: FrameRing, world: SimWorld, index: int) -> None:
    got = ring.read(index)
    assert got is not None
    frame, t_ns = got
    u, v = g.world_to_pixel(g.target_at((t_ns - world.t0_ns) / 1e9), g.TOP_VIEW, W, H)
    assert tuple(frame[int(v), int(u)]) == g.DOT_COLOUR
    ys, xs = np.nonzero(np.all(frame == g.DOT_COLOUR, axis=-1))
    assert abs(xs.mean() + 0.5 - u) < 1 and abs(ys.mean() + 0.5 - v) < 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_camera_process_captures_and_stops_on_signal(
    shm: tuple[FrameRing, SimWorld], prefix: str, signum: signal.Signals
) -> None:
    ring, world = shm
    proc = spawn(spec(ring, world))
    try:
        last = wait_for_frames(ring, proc, 4)
        for index in (last - 1, last):
            assert_shows_the_dot(ring, world, index)
        times = [ring.read(i)[1] for i in (last - 1, last)]  # type: ignore[index]
        assert times[0] < times[1]
        proc.send_signal(signum)
        assert proc.wait(timeout=5) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert proc.stderr.read() == ""
    # The child never unlinks; the parent does, and then nothing is left.
    left = sorted(p.name for p in SHM_DIR.glob(prefix + "*"))
    assert left == [prefix + "sim-world", prefix + "top"]
    ring.unlink()
    world.unlink()
    assert list(SHM_DIR.glob(prefix + "*")) == []


_MIDDLE = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-m", "robotd.runtime.camera_proc", sys.argv[1]])
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def test_camera_process_dies_with_its_parent(shm: tuple[FrameRing, SimWorld]) -> None:
    ring, world = shm
    middle = subprocess.Popen(
        [sys.executable, "-c", _MIDDLE, spec(ring, world)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert middle.stdout is not None
        camera_pid = int(middle.stdout.readline())
        wait_for_frames(ring, middle, 2)  # running, so its death signal is armed
        middle.kill()
        middle.wait()
        deadline = time.monotonic() + 5
        while _alive(camera_pid):
            assert time.monotonic() < deadline, "camera process outlived its parent"
            time.sleep(0.01)
    finally:
        middle.kill()
        middle.wait()
        if _alive(camera_pid):
            os.kill(camera_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while pid runs (a zombie waiting for its new parent counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_bad_start_exits_2_with_one_line(shm: tuple[FrameRing, SimWorld]) -> None:
    ring, world = shm
    without_ring = json.loads(spec(ring, world))
    del without_ring["ring"]
    cases = [
        ('{"name": "top", "driver": ', "camera_proc: camera <unknown>: bad json spec"),
        (json.dumps(without_ring), "camera 'top': bad json spec: ring: required key is missing"),
        (spec(ring, world, driver="nosuch"), "camera 'top': unknown driver 'nosuch'"),
        (
            spec(ring, world, options={"view": "side"}),
            "camera 'top': driver 'sim': cameras.top.options.view: must be one of",
        ),
        (
            spec(ring, world, ring="robotd-test-absent"),
            "camera 'top': shared memory 'robotd-test-absent' does not exist",
        ),
        (
            spec(ring, world, width=W + 1),
            f"camera 'top': ring '{ring.name}' holds frames of ({H}, {W}, 3)",
        ),
    ]
    procs = [spawn(arg) for arg, _ in cases]  # all at once: start-up dominates
    for proc, (arg, message) in zip(procs, cases):
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 2, (arg, err)
        assert message in err, (arg, err)
        assert err.count("\n") == 1, err
    assert ring.latest() is None
