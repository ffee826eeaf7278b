"""A hung policy is found before the robot's patience runs out: the local worker's
`policy.hang_s` must be shorter than `control.max_hold_steps / control.hz`, or the episode
ends `starved` before the copy is found hung (robotd/config/model.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from robotd.config import DEFAULT_CONFIG, load_config
from robotd.config.model import HANG_SHARE_OF_PATIENCE
from robotd.errors import ConfigError
from tests.daemon_util import REPO
from tests.lines_util import at

CONFIGS = sorted((REPO / "config").glob("*.toml"))


def assert_names_both(text: str, hang: str, steps: int, hz: str, patience: str) -> None:
    assert f"policy.hang_s: {hang} s" in text, text
    assert f"control.max_hold_steps / control.hz = {steps} / {hz} Hz = {patience} s" in text
    assert "starved" in text


@pytest.mark.parametrize(
    ("overrides", "hang", "steps", "hz", "patience"),
    [
        (["policy.hang_s=10"], "10", 300, "30", "10"),  # equal is too late already
        (["policy.hang_s=4", "control.max_hold_steps=90"], "4", 90, "30", "3"),
        (["policy.hang_s=5", "control.hz=100"], "5", 300, "100", "3"),
    ],
)
def test_a_hang_s_the_robot_cannot_wait_for_is_refused_naming_both(
    overrides, hang, steps, hz, patience
):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert_names_both(str(err.value), hang, steps, hz, patience)


def test_in_a_file_too_and_robotd_check_refuses_it(tmp_path: Path):
    path = tmp_path / "robot.toml"
    text = DEFAULT_CONFIG.read_text().replace("max_hold_steps = 300", "max_hold_steps = 60")
    path.write_text(text.replace("timeout_s = 10", "timeout_s = 10\nhang_s = 2.5"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{at(path, 'hang_s =')}: policy.hang_s: ")
    assert_names_both(str(err.value), "2.5", 60, "30", "2")
    out = subprocess.run(
        [sys.executable, "-m", "robotd", "check", "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert_names_both(out.stderr, "2.5", 60, "30", "2")


def test_a_hang_s_just_shorter_than_the_patience_loads():
    assert load_config(None, ["policy.hang_s=9.99"]).policy.hang_s == 9.99


def test_left_unset_the_default_is_capped_to_fit_the_patience():
    assert load_config().policy.hang_s == 5.0  # 10 s of patience: the plain default
    cfg = load_config(None, ["control.max_hold_steps=6"])  # 0.2 s of patience
    assert cfg.policy.hang_s == pytest.approx(0.2 * HANG_SHARE_OF_PATIENCE)
    again = load_config(None, ["control.max_hold_steps=6", f"policy.hang_s={cfg.policy.hang_s}"])
    assert again.policy.hang_s == cfg.policy.hang_s  # what was validated loads as it is


@pytest.mark.parametrize(
    ("path", "where"),
    [(None, 'policy.worker="tcp://10.0.0.2:5555"'), (REPO / "config/openpi-libero.toml", "")],
)
def test_a_worker_the_daemon_does_not_start_has_no_hang_s_of_ours(path, where: str):
    cfg = load_config(path, [*([where] if where else []), "policy.hang_s=60"])
    assert cfg.policy.hang_s == 60 and cfg.policy.worker


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_finds_a_hang_before_it_starves(path: Path):
    cfg = load_config(path)
    local = cfg.policy.link == "robotd" and not cfg.policy.worker
    assert not local or cfg.policy.hang_s < cfg.control.max_hold_steps / cfg.control.hz


def error(path: Path | None, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, list(overrides))
    return str(err.value)


def test_a_patience_past_ten_minutes_is_refused_naming_max_hold_steps():
    assert load_config(None, ["control.max_hold_steps=18000"]).control.max_hold_steps == 18000
    assert error(None, "control.max_hold_steps=18001") == (
        "--set control.max_hold_steps: must be at most 18000 at control.hz = 30 (600 s of "
        "holds), got 18001 (600.03 s): a policy silent that long is gone, not slow"
    )
    # the bound is in time: at 2000 Hz ten minutes are 1.2 million steps
    fast = load_config(None, ["control.hz=2000", "control.max_hold_steps=1200000"])
    assert fast.control.max_hold_steps == 1_200_000


def test_a_patience_made_too_long_by_a_slower_rate_blames_the_rate(tmp_path: Path):
    path = tmp_path / "x.toml"
    text = DEFAULT_CONFIG.read_text()
    path.write_text(text.replace("max_hold_steps = 300", "max_hold_steps = 18000"))
    assert error(path, "control.hz=20").startswith(
        "--set control.hz: control.max_hold_steps: must be at most 12000 at control.hz = 20 "
    )
    assert error(path, "control.hz=20", "control.max_hold_steps=12001").startswith(
        "--set control.max_hold_steps: must be at most 12000"
    )
    path.write_text(text.replace("max_hold_steps = 300", "max_hold_steps = 99999"))
    assert error(path).startswith(
        f"{at(path, 'max_hold_steps =')}: control.max_hold_steps: must be at most 18000 "
    )
