"""Config files: validated into typed models; every error names file, key path and rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from robotd.config import DEFAULT_CONFIG, load_config
from robotd.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]

SIM = DEFAULT_CONFIG.read_text()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.toml"
    path.write_text(text)
    return path


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


def test_bad_value_names_file_key_and_rule(tmp_path):
    path = write(tmp_path, SIM.replace("hz = 30", "hz = -5"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: control.hz: must be > 0, got -5"


def test_unknown_key_is_an_error(tmp_path):
    path = write(tmp_path, SIM.replace("spin_us = 200", "spin_us = 200\nspn_us = 3"))
    with pytest.raises(ConfigError, match=r"x\.toml: control\.spn_us: unknown key"):
        load_config(path)


def test_unknown_driver_option_is_an_error(tmp_path):
    path = write(tmp_path, SIM.replace("tau_s = 0.05", "tau_s = 0.05\ntaus = 1"))
    with pytest.raises(ConfigError, match=r"joints\.options\.taus: unknown key"):
        load_config(path)


def test_camera_option_error_names_the_camera(tmp_path):
    path = write(tmp_path, SIM.replace('view = "wrist"', 'view = "side"'))
    with pytest.raises(ConfigError, match=r"cameras\.wrist\.options\.view: must be one of"):
        load_config(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.toml")


def test_not_toml(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[control\nhz = 3"))


def test_joint_lists_must_match(tmp_path):
    path = write(tmp_path, SIM.replace("upper = [2.8, 2.8, 1.0]", "upper = [2.8, 1.0]"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: joints.upper: needs one value per joint (3), got 2"


def test_gripper_must_be_a_joint(tmp_path):
    path = write(tmp_path, SIM.replace('grippers = ["gripper"]', 'grippers = ["claw"]'))
    with pytest.raises(ConfigError, match=r"grippers: \['claw'\] are not joint names"):
        load_config(path)


def test_literal_rule(tmp_path):
    path = write(tmp_path, SIM.replace('timing = "realtime"', 'timing = "fast"'))
    with pytest.raises(
        ConfigError, match=r"control\.timing: must be one of 'sync' or 'realtime', got 'fast'"
    ):
        load_config(path)


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
    with pytest.raises(
        ConfigError, match=r"x\.toml: robot\.start: 'episode' .* simulated robots only"
    ):
        load_config(path)
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
