"""The OpenCV camera on real video files written by OpenCV here: a normal file, one that
ends, a corrupt one; unplug and replug; the fallback; fitting; and a frame older than its
camera's max_age_ms making the observation invalid in the control kernel."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import cv2
import numpy as np
import pytest

from drivers.base import CameraSpec, DriverContext, DriverFault, JointState, build_camera
from drivers.opencv.camera import fit_into
from robotd.shm import FrameRing

W, H = 160, 120


def write_video(path: Path, frames: int, size=(W, H), fps: float = 30.0) -> Path:
    """Frame i is a flat grey of value 20 + 10·i (MJPG in AVI: OpenCV's own encoder)."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, size)
    assert writer.isOpened()
    for i in range(frames):
        writer.write(np.full((size[1], size[0], 3), 20 + 10 * i, np.uint8))
    writer.release()
    return path


class FakeClock:
    """ns; sleep_until jumps to the deadline and runs `on_sleep` (a replug, say)."""

    def __init__(self) -> None:
        self.now = 10**12
        self.sleeps = 0
        self.on_sleep = lambda n: None

    def __call__(self) -> int:
        return self.now

    def sleep_until(self, deadline: int) -> bool:
        self.now = max(self.now, deadline)
        self.sleeps += 1
        self.on_sleep(self.sleeps)
        return True


@pytest.fixture
def ring():
    r = FrameRing.create(f"robotd-test-cv-{os.getpid()}-{uuid.uuid4().hex[:8]}", (60, 80, 3), 8)
    yield r
    r.close()
    r.unlink()


def camera(options: dict, clock: FakeClock, warnings: list[str], size=(80, 60)):
    ctx = DriverContext(clock=clock, sleep_until=clock.sleep_until, warn=warnings.append)
    return build_camera("opencv", CameraSpec("top", size[0], size[1], 30.0), options, ctx)


def grey(ring: FrameRing, index: int) -> float:
    frame, _ = ring.read(index)
    return float(frame.mean())


def test_a_video_file_is_read_fitted_and_timestamped(tmp_path, ring):
    video = write_video(tmp_path / "a.avi", 6)
    clock, warnings = FakeClock(), []
    cam = camera({"source": str(video)}, clock, warnings)
    cam.open()
    assert cam.granted.width == W and cam.granted.height == H
    assert any("asked 80x60, granted 160x120" in w for w in warnings)
    indices = [cam.capture(ring) for _ in range(4)]
    assert indices == [0, 1, 2, 3]
    values = [grey(ring, i) for i in indices]
    # frame 0 was read at open (to know it delivers), then 1, 2, 3, 4; MJPEG is lossy
    np.testing.assert_allclose(values, [30, 40, 50, 60], atol=3)
    times = [ring.read(i)[1] for i in indices]
    assert np.all(np.diff(times) == int(1e9 / 30))  # paced at the configured rate
    cam.close()
    cam.close()  # idempotent


def test_a_file_loops_by_default(tmp_path, ring):
    video = write_video(tmp_path / "a.avi", 3)
    cam = camera({"source": str(video)}, FakeClock(), [])
    cam.open()
    values = [grey(ring, cam.capture(ring)) for _ in range(5)]
    np.testing.assert_allclose(values, [30, 40, 20, 30, 40], atol=3)


def test_a_file_that_ends_is_a_lost_source_reconnected_with_backoff(tmp_path, ring):
    video = write_video(tmp_path / "a.avi", 3)
    clock, warnings = FakeClock(), []
    cam = camera({"source": str(video), "loop": False}, clock, warnings)
    cam.open()
    values = [grey(ring, cam.capture(ring)) for _ in range(4)]
    np.testing.assert_allclose(values, [30, 40, 30, 40], atol=3)  # reopened from the start
    assert any("lost (the source ended): reconnecting" in w for w in warnings)
    assert any("reconnected after 1 tries" in w for w in warnings)
    assert cam.reconnects == 1


def test_unplugged_then_replugged(tmp_path, ring):
    video = write_video(tmp_path / "cam.avi", 2)
    away = tmp_path / "unplugged.avi"
    clock, warnings = FakeClock(), []
    cam = camera({"source": str(video), "loop": False}, clock, warnings)
    cam.open()
    cam.capture(ring)
    video.rename(away)  # unplug: the next read finds the stream over and the source gone

    def replug(n: int) -> None:
        if n == 5:  # sleep 2 paces the read that finds it gone; 3, 4, 5 back off
            away.rename(video)

    clock.on_sleep = replug
    t0 = clock.now
    index = cam.capture(ring)
    assert grey(ring, index) == pytest.approx(30, abs=3)
    assert any("reconnected after 3 tries (0.7 s)" in w for w in warnings)
    # the backoff doubled between tries: 0.1 + 0.2 + 0.4 s, then a frame's pacing
    assert int(0.7e9) <= clock.now - t0 <= int(0.8e9)


def test_a_source_gone_for_good_is_a_driver_fault(tmp_path, ring):
    video = write_video(tmp_path / "cam.avi", 1)
    cam = camera({"source": str(video), "loop": False, "reconnect_timeout_s": 5}, FakeClock(), [])
    cam.open()
    video.unlink()
    with pytest.raises(DriverFault, match=r"no frame for \d+ s after \d+ reconnect tries"):
        while True:
            cam.capture(ring)


def test_a_file_that_is_no_video_is_refused_or_replaced_by_the_fallback(tmp_path, ring):
    video = tmp_path / "bad.avi"
    video.write_bytes(b"this is not a video\n" * 200)
    cam = camera({"source": str(video)}, FakeClock(), [])
    with pytest.raises(DriverFault, match=r"camera 'top': file .*bad\.avi"):
        cam.open()
    warnings: list[str] = []
    cam = camera({"source": str(video), "fallback": "pattern"}, FakeClock(), warnings)
    cam.open()
    assert any("serving a test pattern instead" in w for w in warnings)
    first, second = (ring.read(cam.capture(ring))[0].copy() for _ in range(2))
    assert first.shape == (60, 80, 3) and not np.array_equal(first, second)  # it moves


@pytest.mark.parametrize("damage", ["header", "frames"])
def test_a_corrupt_video_file_never_crashes_the_camera(tmp_path, ring, damage):
    video = write_video(tmp_path / "torn.avi", 20)
    data = bytearray(video.read_bytes())
    if damage == "header":
        data[:512] = bytes(512)  # FFmpeg may still find the JPEG frames by probing
    else:
        middle = len(data) // 2
        data[middle : middle + 2000] = os.urandom(2000)
    video.write_bytes(bytes(data))
    cam = camera({"source": str(video), "loop": False, "reconnect_timeout_s": 1}, FakeClock(), [])
    try:
        cam.open()
    except DriverFault as exc:
        assert "torn.avi" in str(exc)  # refused, by name
        return
    written = errors = 0
    for _ in range(40):
        try:
            cam.capture(ring)
            written += 1
        except ValueError:
            errors += 1  # a frame that does not decode: the camera process counts and skips
        except DriverFault:
            break
    assert written >= 5  # what still decodes is delivered, fitted
    assert ring.read(ring.latest()[0])[0].shape == (60, 80, 3)


def test_no_device_is_a_fault_or_the_fallback(tmp_path, ring):
    cam = camera({"source": "/dev/video99"}, FakeClock(), [])
    with pytest.raises(DriverFault, match="no such device"):
        cam.open()
    video = write_video(tmp_path / "stand-in.avi", 3)
    warnings: list[str] = []
    cam = camera({"source": 7, "fallback": str(video)}, FakeClock(), warnings)
    cam.open()
    assert any(f"serving the video file {video}" in w for w in warnings)
    assert grey(ring, cam.capture(ring)) == pytest.approx(30, abs=3)


def test_bad_options_are_refused_by_name():
    from drivers.base import DriverConfigError

    for bad in ({"source": -1}, {"fourcc": "MJPEG"}, {"fit": "zoom"}, {"sourse": 0}):
        with pytest.raises(DriverConfigError, match=r"cameras\.top\.options"):
            camera(bad, FakeClock(), [])


@pytest.mark.parametrize("mode", ["stretch", "crop", "pad"])
def test_fit_modes(mode):
    frame = np.zeros((100, 200, 3), np.uint8)
    frame[:, :100] = (255, 0, 0)  # blue left half (BGR)
    frame[:, 100:] = (0, 0, 255)  # red right half
    out = np.full((50, 50, 3), 7, np.uint8)
    fit_into(frame, out, mode)
    assert tuple(out[25, 2]) == (0, 0, 255) and tuple(out[25, 47]) == (255, 0, 0)  # RGB now
    if mode == "pad":
        assert tuple(out[2, 25]) == (0, 0, 0)  # letterbox bars
    fit_into(np.full((50, 50), 9, np.uint8), out, mode)  # grey
    assert out.min() == out.max() == 9
    with pytest.raises(ValueError, match="not an image"):
        fit_into(np.zeros((4, 4, 2), np.uint8), out, mode)


def test_a_frame_older_than_max_age_makes_the_observation_invalid(tmp_path, ring):
    from robotd.config import load_config
    from robotd.control.kernel import Kernel

    cfg = load_config(None, ["cameras.top.max_age_ms=100"])
    from tests.lane_util import plain

    out: list[dict] = []
    kernel = Kernel(cfg, run_id="t", emit=lambda m: out.append(plain(m)))
    kernel.set_contract(4)  # the sim config's first episode starts by itself
    video = write_video(tmp_path / "a.avi", 3)
    clock = FakeClock()
    cam = camera({"source": str(video)}, clock, [])
    cam.open()
    index = cam.capture(ring)
    captured = ring.latest()
    assert captured is not None and captured[0] == index
    joints = JointState(np.zeros(3), np.zeros(3), np.zeros(3), clock.now)
    frames = {"top": captured, "wrist": captured}
    kernel.update(captured[1] + 50_000_000, joints, frames)  # 50 ms old: valid, an ask
    asks = [m for m in out if m["k"] == "ask"]
    assert len(asks) == 1 and kernel.counters.invalid_observations == 0
    kernel.update(captured[1] + 250_000_000, joints, frames)  # 250 ms old: invalid
    steps = [m for m in out if m["k"] == "step"]
    assert [s["ok"] for s in steps] == [True, False]
    assert kernel.counters.invalid_observations == 1
