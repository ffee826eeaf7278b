"""A camera's `max_age_ms` is at least its frame period (1000 / fps ms): a shorter limit
calls the newest frame too old for part of every period (the robot holds then), so it is
refused at load naming the key, both values and what to do; left unset at a rate its
default does not fit, it is fitted to two periods."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from drivers.base import JointState
from robotd.config import DEFAULT_CONFIG, load_config
from robotd.control.record import StepRecorder
from robotd.errors import ConfigError
from tests.lines_util import at

SIM = DEFAULT_CONFIG.read_text()
TOP = "[cameras.top]\ndriver = \"sim\"\nwidth = 640\nheight = 480\nfps = 30\nmax_age_ms = 200\n"


def write(tmp_path: Path, top: str) -> Path:
    assert TOP in SIM
    path = tmp_path / "robot.toml"
    path.write_text(SIM.replace(TOP, top))
    return path


def error(path: Path | None, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, list(overrides))
    return str(err.value)


def test_a_max_age_shorter_than_a_frame_period_is_refused_in_the_file(tmp_path):
    path = write(tmp_path, TOP.replace("fps = 30", "fps = 5").replace("= 200", "= 100"))
    key = f"{at(path, 'max_age_ms =')}: cameras.top.max_age_ms"
    assert error(path) == (
        f"{key}: must be at least one frame period (200 ms at "
        "cameras.top.fps = 5), got 100: the newest frame would be too old 50 % of the time "
        "(the observation invalid, the robot holding); make it 200 ms or more (2 periods, "
        "400 ms, leave a late frame time) or raise cameras.top.fps"
    )


def test_a_set_fps_that_makes_the_files_max_age_too_short_names_the_set():
    line = error(None, "cameras.wrist.fps=4")
    assert line.startswith(
        "--set cameras.wrist.fps: cameras.wrist.max_age_ms: must be at least one frame period "
        "(250 ms at cameras.wrist.fps = 4), got 200: "
    ), line
    assert line.endswith("make it 250 ms or more (2 periods, 500 ms, leave a late frame time) "
                         "or raise cameras.wrist.fps")


def test_it_is_reported_with_the_other_problems_each_camera_by_its_key():
    lines = error(
        None, "cameras.top.fps=10", "cameras.top.max_age_ms=50", "cameras.wrist.fps=2",
        "safety.max_velocity=[1.0]",
    ).splitlines()
    assert [line.partition(": must")[0] for line in lines] == [
        "--set safety.max_velocity: needs one value per joint (3), got 1",
        "--set cameras.top.max_age_ms",
        "--set cameras.wrist.fps: cameras.wrist.max_age_ms",
    ]


def test_a_rate_no_max_age_can_cover_says_to_raise_the_fps():
    assert error(None, "cameras.top.fps=0.05", "cameras.top.max_age_ms=10000").endswith(
        "raise cameras.top.fps to 0.1 or more (max_age_ms is at most 10000 ms)"
    )


def test_one_frame_period_or_more_loads_as_written():
    cfg = load_config(None, ["cameras.top.fps=5", "cameras.top.max_age_ms=200"])
    assert cfg.cameras["top"].max_age_ms == 200
    assert load_config(None).cameras["top"].max_age_ms == 200  # 30 fps: 33.3 ms a frame


def test_an_unset_max_age_is_fitted_to_two_periods_where_the_default_does_not_fit(tmp_path):
    slow = write(tmp_path, TOP.replace("fps = 30", "fps = 2").replace("max_age_ms = 200\n", ""))
    cfg = load_config(slow)
    assert cfg.cameras["top"].max_age_ms == 1000
    assert cfg.cameras["wrist"].max_age_ms == 200  # its own, as written
    assert list(cfg.cameras) == ["top", "wrist"]
    # what was fitted loads again as it is (a run's config snapshot)
    again = load_config(slow, ["cameras.top.max_age_ms=1000"])
    assert again.cameras["top"].max_age_ms == 1000
    fast = write(tmp_path, TOP.replace("max_age_ms = 200\n", ""))
    assert load_config(fast).cameras["top"].max_age_ms == 200  # the default fits 30 fps


def _invalid_share(max_age_ms: float, fps: float, late_ms: float = 0.0) -> float:
    """The share of 30 Hz ticks over 6 s whose observation the control lane's step recorder
    calls invalid, a camera at `fps` delivering each frame `late_ms` after its capture."""
    steps = StepRecorder({"top": int(max_age_ms * 1e6)})
    joints = JointState(np.zeros(3), np.zeros(3), np.zeros(3), 0)
    period_ns, tick_ns = round(1e9 / fps), round(1e9 / 30)
    late_ns, bad, ticks = round(late_ms * 1e6), 0, 180
    for k in range(1, ticks + 1):
        # frames from t = 0, ticks from t = 1 s and 7 ms off the frames' grid
        now = 1_007_000_000 + k * tick_ns
        newest = (now - late_ns) // period_ns * period_ns  # delivered by now
        rec = steps.record(episode=1, wep="w", step=k, now_ns=now, joints=joints,
                           frames={"top": (0, newest)}, truth=None)
        bad += not rec.ok
    return bad / ticks


def test_the_refused_share_is_what_the_robot_would_see_and_the_floor_holds_none():
    assert _invalid_share(100, 5) == pytest.approx(0.5, abs=0.02)  # the message's 50 %
    assert _invalid_share(200, 5) == 0  # one period: every tick has a frame young enough
    # the fitted two periods keep a frame that comes most of a period late valid
    assert _invalid_share(1000, 2, late_ms=400) == 0
    assert _invalid_share(500, 2, late_ms=400) > 0.5
