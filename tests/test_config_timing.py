"""A servo driver's timing options checked against the control tick period at load: a
Bus Watchdog shorter than two periods would stop the servos between ticks, a read budget
longer than one period cannot be met. The errors name the key, its value and the period."""

from __future__ import annotations

import tomllib

import pytest

from robotd import cli
from robotd.config import Config, config_from_dict, load_config
from robotd.errors import ConfigError
from tests.daemon_util import REPO
from tests.lines_util import at

KOCH = REPO / "config" / "koch.toml"  # hz 30 (33.3 ms), watchdog_ms 100
SO101 = REPO / "config" / "so101.toml"  # hz 30, feetech: no watchdog


def test_the_shipped_arm_configs_pass():
    for path in (KOCH, SO101):
        load_config(path)


def test_a_watchdog_shorter_than_two_ticks_in_the_file_is_refused(tmp_path):
    path = tmp_path / "koch.toml"
    path.write_text(KOCH.read_text().replace("watchdog_ms = 100", "watchdog_ms = 60"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert text.startswith(
        f"{at(path, 'watchdog_ms =')}: joints.options.watchdog_ms: 60 ms is shorter than 2 "
    )
    assert "33.3 ms at control.hz = 30" in text and "at least 67 ms, or 0 (off)" in text


def test_the_default_watchdog_at_a_slow_rate_is_fitted_to_it_and_a_given_one_refused():
    # 10 Hz: a tick every 100 ms; a 100 ms Bus Watchdog would trip every tick
    with pytest.raises(ConfigError) as err:
        load_config(KOCH, ["control.hz=10", "joints.options.watchdog_ms=100"])
    assert str(err.value).startswith("--set joints.options.watchdog_ms: 100 ms is shorter")
    unset = KOCH.read_text().replace("watchdog_ms = 100", "")
    fitted = _load_text(unset, ["control.hz=10"])
    assert fitted.joints.options["watchdog_ms"] == 260  # 2.5 periods, in 20 ms steps
    assert "watchdog_ms" not in _load_text(unset, []).joints.options  # 30 Hz: the default fits


@pytest.mark.parametrize(
    ("overrides", "ok"),
    [
        (["control.hz=20"], True),  # 100 ms = exactly two 50 ms periods
        (["control.hz=19"], False),  # two 52.6 ms periods: 105 ms
        (["control.hz=10", "joints.options.watchdog_ms=0"], True),  # off: nothing to trip
        (["control.hz=1", "joints.options.watchdog_ms=2000"], True),
    ],
)
def test_the_watchdog_boundary(overrides, ok):
    if ok:
        load_config(KOCH, overrides)
    else:
        with pytest.raises(ConfigError, match="watchdog_ms"):
            load_config(KOCH, overrides)


def test_a_read_budget_longer_than_a_tick_is_refused_and_the_default_fitted():
    # 100 Hz: a 10 ms tick; the default budget (12 ms) becomes 80 % of it
    fitted = _load_text(SO101.read_text(), ["control.hz=100"])
    assert fitted.joints.options["budget_ms"] == 8.0
    with pytest.raises(ConfigError) as err:
        load_config(SO101, ["control.hz=100", "joints.options.budget_ms=12"])
    text = str(err.value)
    assert "--set joints.options.budget_ms: 12 ms is longer than the control tick " in text
    assert "(10.0 ms at control.hz = 100)" in text and "at most 10 ms" in text
    load_config(SO101, ["control.hz=100", "joints.options.budget_ms=10"])  # exactly one tick
    with pytest.raises(ConfigError, match=r"--set joints\.options\.budget_ms: 40 ms is longer"):
        load_config(SO101, ["joints.options.budget_ms=40"])


def test_robotd_check_reports_it(capsys):
    code = cli.main(["check", "--config", str(KOCH), "--set", "joints.options.watchdog_ms=40"])
    assert code == 2
    assert "watchdog_ms: 40 ms is shorter than 2 control tick periods" in capsys.readouterr().err


def test_a_driver_without_these_options_is_not_checked():
    load_config(None, ["control.hz=2000"])  # the simulator: no watchdog, no read budget


def _load_text(text: str, overrides: list[str]) -> Config:
    """A config from TOML text (a shipped one edited), as load_config reads a file."""
    return config_from_dict(tomllib.loads(text), where="x.toml", overrides=overrides)
