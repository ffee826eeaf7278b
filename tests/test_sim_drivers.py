"""Sim world, arm, renderer and camera, driven by a fake clock."""

from __future__ import annotations

import importlib.resources
import math
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from drivers.base import CameraSpec, DriverContext, DriverFault
from drivers.sim import geometry as g
from drivers.sim.arm import EFFORT_GAIN, WRITE_ADVANCE_NS, SimArm
from drivers.sim.camera import MAX_FAILURES, SimCamera
from drivers.sim.render import render
from drivers.sim.world import SimWorld
from robotd.config import _default_config, load_config
from robotd.shm import FrameRing, ShmError, unlink_prefix

NAMES = ("shoulder", "elbow", "gripper")
MS = 1_000_000


class FakeClock:
    """A clock in ns that moves only when told; sleep_until jumps it to the deadline."""

    def __init__(self, now: int = 10**12) -> None:
        self.now = now
        self.sleeps: list[int] = []

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns

    def sleep_until(self, deadline: int) -> bool:
        self.sleeps.append(deadline)
        self.now = max(self.now, deadline)
        return True


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"robotd-test-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    yield p
    unlink_prefix(p)


def make_arm(clock: FakeClock, world: SimWorld | None = None, **options: object) -> SimArm:
    """A noise-free arm at the zero pose on `clock`, opened: in `world` if given (else in a
    world of its own), with `options` on top of those."""
    opts = SimArm.Options(noise=0.0, initial=[0.0, 0.0, 0.0], **options)  # type: ignore[arg-type]
    arm = SimArm(NAMES, opts, DriverContext(clock=clock), world=world)
    arm.open()
    return arm


def run(arm: SimArm, clock: FakeClock, ms: int, step_ms: int = 10) -> np.ndarray:
    for _ in range(ms // step_ms):
        clock.advance(step_ms * MS)
        state = arm.read()
    return state.position


# ---- world --------------------------------------------------------------------------


def test_world_shared_between_attachments(prefix: str) -> None:
    world = SimWorld.create(prefix + "world", 3, 123)
    other = SimWorld.attach(prefix + "world")
    assert other.t0_ns == 123 and other.n_joints == 3
    q, t = other.snapshot()
    assert np.array_equal(q, np.zeros(3)) and t == 123
    world.publish(np.array([0.1, 0.2, 0.3]), 456)
    q, t = other.snapshot()
    assert np.array_equal(q, [0.1, 0.2, 0.3]) and t == 456
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        world.publish(np.zeros(2), 0)
    other.close()
    with pytest.raises(ShmError, match="closed"):
        other.snapshot()
    world.close()
    world.unlink()
    world.unlink()


def test_world_attach_errors(prefix: str) -> None:
    with pytest.raises(ShmError, match="does not exist"):
        SimWorld.attach(prefix + "nope")
    FrameRing.create(prefix + "ring", (2, 2, 3), 2).close()
    with pytest.raises(ShmError, match="not a sim world"):
        SimWorld.attach(prefix + "ring")
    SimWorld.create(prefix + "world", 2, 0).close()
    with pytest.raises(ShmError, match="already exists"):
        SimWorld.create(prefix + "world", 2, 0)
    local = SimWorld.local(2, 5)
    local.publish(np.ones(2), 9)
    assert local.snapshot()[1] == 9 and local.t0_ns == 5


# ---- arm ----------------------------------------------------------------------------


def test_arm_first_order_response() -> None:
    clock = FakeClock()
    arm = make_arm(clock)
    arm.torque(True)
    target = np.array([0.1, -0.1, 0.05])  # slow enough that the speed limit never binds
    arm.write(target)
    position = run(arm, clock, 50)  # one time constant
    np.testing.assert_allclose(position, target * (1 - math.exp(-1)), rtol=1e-9)
    position = run(arm, clock, 1000)
    np.testing.assert_allclose(position, target, atol=1e-8)


def test_arm_velocity_limit_and_stops() -> None:
    clock = FakeClock()
    arm = make_arm(clock)
    arm.torque(True)
    arm.write(np.array([2.0, 0.0, 0.0]))
    position = run(arm, clock, 100)
    assert position[0] == pytest.approx(0.4, abs=1e-12)  # 4 rad/s for 0.1 s
    assert arm.read().velocity[0] == pytest.approx(4.0)
    arm.write(np.array([5.0, -5.0, 2.0]))  # beyond every stop
    position = run(arm, clock, 3000)
    np.testing.assert_allclose(position, [2.8, -2.8, 1.0])
    state = arm.read()
    np.testing.assert_allclose(state.effort, EFFORT_GAIN * np.array([2.2, -2.2, 1.0]))


def test_arm_custom_stops_and_option_errors() -> None:
    clock = FakeClock()
    arm = make_arm(clock, lower=[-1.0, -1.0, 0.0], upper=[0.5, 1.0, 0.2])
    arm.torque(True)
    arm.write(np.array([1.0, 0.0, 1.0]))
    np.testing.assert_allclose(run(arm, clock, 3000), [0.5, 0.0, 0.2])
    with pytest.raises(ValueError, match="option upper: 2 values for 3 joints"):
        SimArm(NAMES, SimArm.Options(upper=[1.0, 1.0]))
    with pytest.raises(ValueError, match="option initial"):
        SimArm(NAMES, SimArm.Options(initial=[0.0, 0.0, 5.0]))
    with pytest.raises(ValueError, match="'elbow' has lower >= upper"):
        SimArm(NAMES, SimArm.Options(lower=[0, 1, 0], upper=[1, 1, 1]))
    with pytest.raises(ValueError, match="names"):
        SimArm(["only"], SimArm.Options())
    with pytest.raises(ValueError):
        SimArm.Options(tau_s=0)
    with pytest.raises(ValueError):
        SimArm.Options(bogus=1)  # type: ignore[call-arg]


def test_arm_torque_off_holds_still_and_torque_on_does_not_jump() -> None:
    clock = FakeClock()
    arm = make_arm(clock)
    arm.write(np.array([1.0, 1.0, 1.0]))
    position = run(arm, clock, 500)
    np.testing.assert_array_equal(position, [0.0, 0.0, 0.0])
    assert not arm.read().velocity.any() and not arm.read().effort.any()
    arm.torque(True)  # holds where it is: the target written while off is dropped
    np.testing.assert_array_equal(run(arm, clock, 500), [0.0, 0.0, 0.0])


def test_arm_bad_writes_and_closed_use() -> None:
    clock = FakeClock()
    arm = make_arm(clock)
    with pytest.raises(DriverFault, match=r"shape \(3,\)"):
        arm.write(np.zeros(2))
    with pytest.raises(DriverFault, match="'elbow'") as info:
        arm.write(np.array([0.0, np.nan, 0.0]))
    assert info.value.joint == "elbow"
    with pytest.raises(DriverFault, match="not numbers"):
        arm.write(np.array(["a", "b", "c"]))
    arm.close()
    arm.close()
    with pytest.raises(DriverFault, match="not open"):
        arm.read()


def test_arm_noise_is_seeded() -> None:
    def positions(seed: int) -> np.ndarray:
        clock = FakeClock()
        arm = SimArm(NAMES, SimArm.Options(seed=seed, noise=0.01), DriverContext(clock=clock))
        arm.open()
        return np.array([run(arm, clock, 10) for _ in range(20)])

    a, b, c = positions(1), positions(1), positions(2)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert 0.003 < float(np.std(a - a.mean(axis=0))) < 0.03


def test_arm_ground_truth_and_world() -> None:
    clock = FakeClock()
    world = SimWorld.local(3, clock.now - 2_500 * MS)  # the world started 2.5 s ago
    arm = make_arm(clock, world)
    truth = arm.ground_truth()
    target = g.target_at(2.5)
    assert (truth["tip_x"], truth["tip_y"]) == pytest.approx((1.8, 0.0))
    assert (truth["target_x"], truth["target_y"]) == pytest.approx(tuple(target))
    assert truth["tracking_error"] == pytest.approx(math.hypot(1.8 - target[0], target[1]))
    arm.torque(True)
    arm.write(np.array([0.3, 0.2, 0.5]))
    state = arm.read()
    clock.advance(20 * MS)
    state = arm.read()
    q, t = world.snapshot()
    assert np.array_equal(q, state.position) and t == clock.now == state.read_time_ns


def test_arm_ground_truth_reports_the_last_advance_without_advancing() -> None:
    clock = FakeClock()
    world = SimWorld.local(3, clock.now)
    arm = make_arm(clock, world)
    arm.torque(True)
    arm.write(np.array([0.3, 0.2, 0.5]))
    clock.advance(20 * MS)
    state = arm.read()
    read_at = clock.now
    clock.advance(30 * MS)  # time passes, nothing integrates it
    truth = arm.ground_truth()
    q, t = world.snapshot()
    assert t == read_at and np.array_equal(q, state.position)  # not published again
    tip = g.forward(state.position)[1]
    dot = g.target_at(0.02)  # the dot as it was at the read, not 50 ms in
    assert (truth["tip_x"], truth["tip_y"]) == pytest.approx(tuple(tip), abs=1e-12)
    assert (truth["target_x"], truth["target_y"]) == pytest.approx(tuple(dot), abs=1e-12)
    assert truth == arm.ground_truth()
    arm.sync()  # integrates to now and publishes
    q, t = world.snapshot()
    assert t == clock.now and not np.array_equal(q, state.position)
    assert arm.ground_truth()["target_x"] == pytest.approx(g.target_at(0.05)[0])


def test_arm_write_right_after_a_read_does_not_advance() -> None:
    clock = FakeClock()
    world = SimWorld.local(3, clock.now)
    arm = make_arm(clock, world)
    arm.torque(True)
    arm.write(np.array([0.1, 0.0, 0.0]))
    clock.advance(10 * MS)
    arm.read()
    read_at = clock.now
    clock.advance(WRITE_ADVANCE_NS)  # the control tick's read → update → write
    arm.write(np.array([0.2, 0.0, 0.0]))
    assert world.snapshot()[1] == read_at  # integrated and published once this tick
    clock.advance(WRITE_ADVANCE_NS + 1)
    arm.write(np.array([0.2, 0.0, 0.0]))
    assert world.snapshot()[1] == clock.now  # long after the last advance: integrates first


def test_arm_old_target_governs_motion_up_to_a_late_write() -> None:
    clock = FakeClock()
    arm = make_arm(clock)
    arm.torque(True)
    a, b = 0.1, -0.05  # slow enough that the speed limit never binds
    arm.write(np.array([a, 0.0, 0.0]))
    clock.advance(50 * MS)  # no read in between: the write must integrate the 50 ms of `a`
    arm.write(np.array([b, 0.0, 0.0]))
    clock.advance(50 * MS)
    decay = math.exp(-1)  # 50 ms is one time constant
    after_a = a * (1 - decay)
    expected = b + (after_a - b) * decay
    assert arm.read().position[0] == pytest.approx(expected, rel=1e-12)


def test_arm_default_pose_starts_on_the_dot() -> None:
    clock = FakeClock()
    arm = SimArm(NAMES, SimArm.Options(noise=0.0), DriverContext(clock=clock))
    arm.open()
    assert arm.ground_truth()["tracking_error"] == pytest.approx(0.0, abs=1e-9)
    assert arm.read().position[2] == 0.0


# ---- render -------------------------------------------------------------------------


def dot_centroid(img: np.ndarray) -> tuple[float, float]:
    ys, xs = np.nonzero(np.all(img == g.DOT_COLOUR, axis=-1))
    assert xs.size > 0, "no dot pixels"
    return float(xs.mean()) + 0.5, float(ys.mean()) + 0.5


@pytest.mark.parametrize("t_s", [0.0, 1.7, 4.2, 9.9])
def test_render_top_puts_the_dot_where_world_to_pixel_says(t_s: float) -> None:
    q = np.array([-0.3, 0.5])
    img = render("top", 640, 480, q, t_s)
    u, v = g.world_to_pixel(g.target_at(t_s), g.TOP_VIEW, 640, 480)
    cu, cv = dot_centroid(img)
    assert abs(cu - u) < 0.5 and abs(cv - v) < 0.5
    radius_px = g.DOT_RADIUS * 640 / (g.TOP_VIEW[2] - g.TOP_VIEW[0])
    area = np.all(img == g.DOT_COLOUR, axis=-1).sum()
    assert area == pytest.approx(math.pi * radius_px**2, rel=0.15)
    counts = [np.all(img == c, axis=-1).sum() for c in (g.BACKGROUND, g.ARM_COLOUR, g.TIP_COLOUR)]
    assert all(counts) and sum(counts) + area == 640 * 480  # exact colours only: no blending
    _, tip = g.forward(q)
    tu, tv = g.world_to_pixel(tip, g.TOP_VIEW, 640, 480)
    assert tuple(img[int(tv), int(tu)]) == g.TIP_COLOUR


def test_render_dot_on_top_and_wrist_view() -> None:
    q = g.inverse(g.target_at(0.0))  # tip exactly on the dot
    top = render("top", 640, 480, q, 0.0)
    u, v = g.world_to_pixel(g.target_at(0.0), g.TOP_VIEW, 640, 480)
    assert tuple(top[int(v), int(u)]) == g.DOT_COLOUR
    wrist = render("wrist", 320, 240, q, 0.0)
    assert tuple(wrist[120, 160]) == g.DOT_COLOUR  # the tip (image centre) is under the dot
    wrist_later = render("wrist", 320, 240, q, 2.0)  # the dot moved away
    assert tuple(wrist_later[120, 160]) == g.TIP_COLOUR
    out = np.zeros((240, 320, 3), np.uint8)
    assert render("wrist", 320, 240, q, 2.0, out=out) is out
    assert np.array_equal(out, wrist_later)


def test_render_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="view"):
        render("side", 64, 48, np.zeros(2), 0.0)
    with pytest.raises(ValueError, match="out must be"):
        render("top", 64, 48, np.zeros(2), 0.0, out=np.zeros((48, 64), np.uint8))
    with pytest.raises(ValueError, match="q needs"):
        render("top", 64, 48, np.array([np.nan, 0.0]), 0.0)


# ---- camera -------------------------------------------------------------------------


def make_camera(clock: FakeClock, world: SimWorld, fps: float = 10.0) -> SimCamera:
    cam = SimCamera(
        CameraSpec("top", 80, 60, fps),
        SimCamera.Options(),
        DriverContext(clock=clock, sleep_until=clock.sleep_until),
        world=world,
    )
    cam.open()
    return cam


def test_camera_keeps_absolute_deadlines_and_skips_missed_ones(prefix: str) -> None:
    clock = FakeClock()
    t0 = clock.now
    world = SimWorld.local(2, t0)
    ring = FrameRing.create(prefix + "cam", (60, 80, 3), 8)
    cam = make_camera(clock, world)
    times = []
    for lateness in (0, 3 * MS, 0, 130 * MS, 350 * MS, 0):
        clock.advance(lateness)  # work done between captures
        index = cam.capture(ring)
        got = ring.read(index)
        assert got is not None
        times.append(got[1] - t0)
    # Deadlines k / fps from open; a late capture is not followed by a catch-up burst.
    # 130 ms of work: late for the 300 ms deadline, taken at once; 350 ms more: the
    # 400 and 500 ms deadlines are skipped, 600 ms is taken late, then on time again.
    assert times == [0, 100 * MS, 200 * MS, 330 * MS, 680 * MS, 700 * MS]
    assert [s - t0 for s in clock.sleeps] == [100 * MS, 200 * MS, 700 * MS]
    assert cam.missed == 2 and cam.frames == 6 and cam.failures == 0
    ring.close()


def test_camera_renders_the_world_at_capture_time(prefix: str) -> None:
    clock = FakeClock()
    world = SimWorld.local(2, clock.now - 1_300 * MS)
    world.publish(np.array([0.2, 0.4]), clock.now)
    ring = FrameRing.create(prefix + "cam", (60, 80, 3), 4)
    cam = make_camera(clock, world)
    index = cam.capture(ring)
    got = ring.read(index)
    assert got is not None
    frame, t_ns = got
    expected = render("top", 80, 60, np.array([0.2, 0.4]), (t_ns - world.t0_ns) / 1e9)
    assert np.array_equal(frame, expected)
    assert np.array_equal(cam.render_now(t_ns), expected)
    ring.close()


def test_camera_faults_after_a_run_of_bad_frames(prefix: str) -> None:
    clock = FakeClock()
    world = SimWorld.local(2, clock.now)
    ring = FrameRing.create(prefix + "cam", (60, 80, 3), 4)
    cam = make_camera(clock, world)
    ring.close()  # every frame now fails
    with pytest.raises(DriverFault, match="bad frames in a row") as info:
        cam.capture(ring)
    assert info.value.joint == "top" and cam.failures == MAX_FAILURES
    wrong = FrameRing.create(prefix + "wrong", (10, 10, 3), 2)
    with pytest.raises(ValueError, match="holds"):
        cam.capture(wrong)
    wrong.close()


def test_camera_option_errors() -> None:
    world = SimWorld.local(2, 0)
    with pytest.raises(ValueError, match="needs a world or a shm_prefix"):
        SimCamera(CameraSpec("top", 80, 60, 10), SimCamera.Options())
    with pytest.raises(ValueError, match="fps"):
        SimCamera(CameraSpec("top", 80, 60, 0), SimCamera.Options(), world=world)
    with pytest.raises(ValueError):
        SimCamera.Options(view="side")  # type: ignore[arg-type]


# ---- the packaged sim config ----------------------------------------------------------


def test_packaged_default_config_equals_config_sim_toml() -> None:
    packaged = importlib.resources.files("robotd") / "data" / "sim.toml"
    repo = Path(__file__).resolve().parent.parent / "config" / "sim.toml"
    assert packaged.read_bytes() == repo.read_bytes(), (
        "robotd/data/sim.toml (package data) must be a copy of config/sim.toml: "
        "cp config/sim.toml robotd/data/sim.toml"
    )


def test_default_config_falls_back_to_the_packaged_copy(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parent.parent / "config" / "sim.toml"
    assert _default_config(repo) == repo  # a source checkout: the file the README names
    fallback = _default_config(tmp_path / "config" / "sim.toml")  # a wheel install
    assert fallback.name == "sim.toml" and fallback.parent.name == "data"
    assert load_config(fallback).cameras.keys() == {"top", "wrist"}
