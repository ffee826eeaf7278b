"""Config files: validated into typed models; every error names file, key path and rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from robotd.config import load_config
from robotd.errors import ConfigError
from tests.config_util import SIM, write
from tests.lines_util import at

REPO = Path(__file__).resolve().parents[1]


def test_sim_config_is_the_embedded_default():
    cfg = load_config()
    assert cfg.control.hz == 30
    assert set(cfg.cameras) == {"top", "wrist"}
    assert (cfg.cameras["top"].width, cfg.cameras["top"].height, cfg.cameras["top"].fps) == (
        640,
        480,
        30,
    )
    assert (cfg.cameras["wrist"].width, cfg.cameras["wrist"].height) == (320, 240)
    assert cfg.observation_keys == ["top", "wrist", "joints.pos", "joints.vel"]
    assert cfg.robot.start == "episode"


# Each case edits one line of the sim config (`old` becomes `new`) so that it breaks one
# rule; the error must say where and which.
@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        pytest.param(
            "hz = 30", "hz = -5", "control.hz: must be > 0, got -5", id="bad-value-names-the-rule"
        ),
        pytest.param(
            "upper = [2.8, 2.8, 1.0]",
            "upper = [2.8, 1.0]",
            "joints.upper: needs one value per joint (3), got 2",
            id="joint-lists-must-match",
        ),
    ],
)
def test_a_broken_rule_is_said_with_file_and_key(
    tmp_path: Path, old: str, new: str, said: str
) -> None:
    """The whole message, exactly: the file and the edited line, then the key path and the
    rule (`said`)."""
    path = write(tmp_path, SIM.replace(old, new))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{at(path, new)}: {said}"


@pytest.mark.parametrize(
    ("old", "new", "pattern"),
    [
        pytest.param(
            "spin_us = 200",
            "spin_us = 200\nspn_us = 3",
            r"control\.spn_us: unknown key",
            id="unknown-key",
        ),
        pytest.param(
            "tau_s = 0.05",
            "tau_s = 0.05\ntaus = 1",
            r"joints\.options\.taus: unknown key",
            id="unknown-driver-option",
        ),
        pytest.param(
            'view = "wrist"',
            'view = "side"',
            r"cameras\.wrist\.options\.view: must be one of",
            id="camera-option-names-the-camera",
        ),
        pytest.param(
            'grippers = ["gripper"]',
            'grippers = ["claw"]',
            r"grippers: \['claw'\] are not joint names",
            id="gripper-must-be-a-joint",
        ),
        pytest.param(
            'timing = "realtime"',
            'timing = "fast"',
            r"control\.timing: must be one of 'sync' or 'realtime', got 'fast'",
            id="literal-rule",
        ),
    ],
)
def test_a_broken_rule_is_an_error_naming_the_key(
    tmp_path: Path, old: str, new: str, pattern: str
) -> None:
    """The message holds `pattern` (a regular expression): the key path and the rule, on
    the edited line (the last of `new`)."""
    path = write(tmp_path, SIM.replace(old, new))
    with pytest.raises(ConfigError, match=pattern) as err:
        load_config(path)
    assert str(err.value).startswith(f"{at(path, new.splitlines()[-1])}: ")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.toml")


def test_not_toml(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[control\nhz = 3"))


def test_an_empty_string_where_one_is_needed_is_said_in_words():
    with pytest.raises(ConfigError, match=r"--set joints\.options\.port: must not be empty$"):
        load_config(REPO / "config" / "so101.toml", ['joints.options.port=""'])


def test_overrides_are_validated_like_the_file():
    cfg = load_config(
        None, ["control.hz=100", "control.timing=realtime", "policy.args.latency_ms=150"]
    )
    assert cfg.control.hz == 100
    assert cfg.control.timing == "realtime"
    assert cfg.policy.args == {"latency_ms": 150}
    with pytest.raises(ConfigError, match=r"control\.hz: must be > 0, got 0"):
        load_config(None, ["control.hz=0"])
    with pytest.raises(ConfigError, match=r"control\.nope: unknown key"):
        load_config(None, ["control.nope=1"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(None, ["control.hz"])
    with pytest.raises(ConfigError, match=r"control\.hz is a value, not a table"):
        load_config(None, ["control.hz.x=1"])


def test_real_robot_may_not_start_moving_by_itself(tmp_path):
    text = SIM.replace('[cameras.top]\ndriver = "sim"', '[cameras.top]\ndriver = "opencv"')
    path = write(tmp_path, text.replace('[cameras.top.options]\nview = "top"', ""))
    with pytest.raises(ConfigError, match=r"robot\.start: 'episode' .* simulated robots only") as e:
        load_config(path)
    assert str(e.value).startswith(f"{at(path, 'start =')}: robot.start: ")
    # A driver name that names no driver is reported as such, before the rule above.
    path = write(tmp_path, text.replace('driver = "opencv"', 'driver = "nosuch"'))
    with pytest.raises(
        ConfigError, match=r"cameras\.top\.driver: unknown driver 'nosuch' \(known: .*sim"
    ):
        load_config(path)


def test_start_latched_is_the_default(tmp_path):
    text = SIM.replace('start = "episode"', "")
    cfg = load_config(write(tmp_path, text))
    assert cfg.robot.start == "latched"


def test_cli_check_reports_config_errors(tmp_path, capsys):
    from robotd.cli import main

    path = write(tmp_path, SIM.replace("hz = 30", "hz = -5"))
    assert main(["check", "--config", str(path)]) == 2
    assert "control.hz: must be > 0, got -5" in capsys.readouterr().err


def test_blending_needs_realtime_aligned_timing():
    with pytest.raises(ConfigError, match=r"control\.merge: 'fade' blends chunks in realtime"):
        load_config(None, ['control.timing="sync"', 'control.merge="fade"'])
    with pytest.raises(ConfigError, match="not with aligned = false"):
        load_config(
            None, ['control.timing="realtime"', 'control.merge="ensemble"', "control.aligned=false"]
        )
    cfg = load_config(None, ['control.timing="realtime"', 'control.merge="fade"'])
    assert cfg.control.merge == "fade"


def test_run_refuses_the_virtual_clock(capsys):
    from robotd.cli import main

    assert main(["run", "--set", 'control.clock="virtual"']) == 2
    assert "control.clock: 'virtual' runs in one process" in capsys.readouterr().err


def test_a_contract_in_the_config_is_checked_at_load():
    bad_offset = r"policy\.observations\.streams\['top'\]\.at.*offset 3 > 0"
    with pytest.raises(ConfigError, match=bad_offset):
        load_config(None, ["policy.observations={streams={top={at=[3,0]}}}"])
    with pytest.raises(ConfigError, match=r"\['side'\] are not observation keys"):
        load_config(None, ["policy.observations={streams={side={}}}"])
    with pytest.raises(ConfigError, match=r"policy\.actions"):
        load_config(None, ["policy.actions={hz=-1}"])
    cfg = load_config(None, ["policy.observations={streams={top={at=[-3,0]}}}"])
    assert cfg.policy.observations == {"streams": {"top": {"at": [-3, 0]}}}


def test_errors_name_a_set_override_as_such(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["control.hz=-5"])
    assert str(err.value) == "--set control.hz: must be > 0, got -5"


def test_a_config_that_is_not_utf8(tmp_path):
    path = tmp_path / "x.toml"
    path.write_bytes(b'name = "\xff"\n')
    with pytest.raises(ConfigError, match=r"x\.toml: not UTF-8 text"):
        load_config(path)


def test_a_run_dir_too_long_for_ipc_sockets():
    long_dir = "/tmp/" + "x" * 100
    with pytest.raises(ConfigError, match=r"--set runtime\.dir: .* too long for the ipc sockets"):
        load_config(None, [f'runtime.dir="{long_dir}"'])


@pytest.mark.parametrize(
    "worker",
    ["", "stream+tcp://gpu-box:5555", "stream+ipc:///run/w.sock", "tcp://gpu:5555", "ipc:///w"],
)
def test_robotd_worker_endpoints_are_taken(worker: str) -> None:
    assert load_config(None, [f'policy.worker="{worker}"']).policy.worker == worker


@pytest.mark.parametrize(
    ("worker", "needle"),
    [
        ("stream+tcp://gpu-box", "policy.worker: 'stream+tcp://gpu-box': want stream"),
        ("stream+tcp://*:5555", "'*' is for binding"),
        ("zmq://gpu:5555", "policy.worker: 'zmq://gpu:5555': a robotd worker listens on"),
        ("ws://gpu:8000", 'ws:// and wss:// are for policy.link = "openpi"'),
    ],
)
def test_bad_worker_endpoints_are_named(worker: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(None, [f'policy.worker="{worker}"'])


def test_the_native_link_is_robotd_and_its_old_name_still_taken() -> None:
    assert load_config().policy.link == "robotd"
    assert load_config(None, ['policy.link="zmq"']).policy.link == "robotd"
    with pytest.raises(ConfigError, match=r"policy\.link"):
        load_config(None, ['policy.link="grpc"'])
