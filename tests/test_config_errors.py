"""Config mistakes that `run` would refuse are refused at load, each as one line naming
the source (the file, or the --set that gave the value), the key and the rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from robotd.config import load_config
from tests.config_util import SIM, error, write
from tests.lines_util import at

SO101 = (Path(__file__).resolve().parents[1] / "config" / "so101.toml").read_text()


# ---- 1: every float finite ------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("[policy]", "timeout_s"),
        ("[cameras.top]", "max_age_ms"),
        ("[control]", "stats_interval_s"),
        ("[control]", "ensemble_decay"),
        ("[control]", "latency_s"),
        ("[control]", "orphan_s"),
        ("[safety]", "clip_tolerance"),
    ],
)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_a_float_that_is_not_finite_is_refused_naming_the_key(tmp_path, table, key, value):
    section = table.strip("[]")
    text = re.sub(rf"^{key} = .*\n", "", SIM, flags=re.MULTILINE)  # the file's own value
    path = write(tmp_path, text.replace(f"{table}\n", f"{table}\n{key} = {value}\n", 1))
    assert error(path) == (
        f"{at(path, f'{key} = {value}')}: {section}.{key}: must be a finite number, got {value}"
    )


def test_nan_is_not_reported_as_out_of_bounds():
    assert error(None, "control.hz=nan") == "--set control.hz: must be a finite number, got nan"


def test_a_string_infinity_is_refused_too():
    text = error(None, 'policy.timeout_s="inf"')
    assert text == "--set policy.timeout_s: must be a number, got 'inf'"  # a string is none


def test_a_driver_option_that_is_not_finite(tmp_path):
    path = write(tmp_path, SIM.replace("noise = 0.0005", "noise = nan"))
    noise = at(path, "noise = nan")
    assert error(path) == f"{noise}: joints.options.noise: must be a finite number, got nan"
    assert error(None, "joints.options.lower=[-1.0, inf, 0.0]") == (
        "--set joints.options.lower[1]: must be a finite number, got inf"
    )


def test_policy_args_are_the_policys_own():
    cfg = load_config(None, ["policy.args.latency_ms=inf"])
    assert cfg.policy.args["latency_ms"] == float("inf")


# ---- 2: values that crashed the run ----------------------------------------------------


def test_control_hz_has_a_real_lower_bound():
    assert error(None, "control.hz=1e-300").startswith("--set control.hz: must be >= 1")
    assert error(None, "control.hz=0.5").startswith("--set control.hz: must be >= 1")
    assert load_config(None, ["control.hz=1"]).control.hz == 1


def test_a_ring_with_too_many_slots_names_fps_and_ring_seconds(tmp_path):
    text = SIM.replace(
        "fps = 30\nmax_age_ms = 200\n\n[cameras.top.options]",
        "fps = 1000\nring_seconds = 60\nmax_age_ms = 200\n\n[cameras.top.options]",
    )
    path = write(tmp_path, text)
    message = error(path)
    ring = at(path, "ring_seconds =")
    assert message.startswith(f"{ring}: cameras.top.ring_seconds: 60 s at cameras.top.fps = 1000")
    assert "60001 ring slots, at most 4096" in message


def test_a_ring_bigger_than_memory_is_refused_with_its_size():
    message = error(
        None, "cameras.top.width=8192", "cameras.top.height=8192", "cameras.top.fps=1000"
    )
    assert "cameras.top: its shared-memory ring needs 403 GB" in message
    assert "8192 × 8192 × 3" in message and "this machine's memory" in message


def test_stream_wait_is_at_most_what_the_worker_accepts():
    from robotd.worker.requests import MAX_WAIT_S

    assert load_config(None, [f"policy.stream_wait_s={MAX_WAIT_S}"])
    assert error(None, f"policy.stream_wait_s={MAX_WAIT_S * 2}").startswith(
        f"--set policy.stream_wait_s: must be <= {MAX_WAIT_S:g}"
    )


# ---- 4: driver options against the joints, policy.serve's form -------------------------


def test_servo_ids_one_per_joint_at_load(tmp_path):
    path = write(tmp_path, SO101.replace("ids = [1, 2, 3, 4, 5, 6]", "ids = [1, 2, 3, 4, 5]"))
    ids = at(path, "ids =")
    assert error(path).startswith(f"{ids}: joints.options.ids: one servo ID per joint (6: ")
    assert error(write(tmp_path, SO101), "joints.options.ids=[1, 2]").startswith(
        "--set joints.options.ids: one servo ID per joint (6: "
    )
    text = SO101.replace('grippers = ["gripper"]\ncalibration', 'grippers = ["grip"]\ncalibration')
    said = error(write(tmp_path, text))
    grippers = at(path, "grippers =", "[joints.options]")
    assert said.startswith(f"{grippers}: joints.options.grippers: ['grip'] are not joint names")


def test_servo_models_are_known_ones_one_per_joint_at_load(tmp_path):
    five = '["sts3215", "sts3215", "sts3215", "sts3215", "sts3215"]'
    path = write(tmp_path, re.sub(r"models = \[[^\]]*\]", f"models = {five}", SO101))
    assert error(path).startswith(
        f"{at(path, 'models =')}: joints.options.models: one model per joint (6: "
    ), error(path)
    said = error(write(tmp_path, SO101), 'joints.options.models=["sts3215", "XL430-W250"]')
    assert said == (
        "--set joints.options.models: models[1] 'XL430-W250' is not a Feetech model this "
        "driver knows (sts3215, sts3250)"
    ), said


def test_sim_initial_one_per_joint_at_load(tmp_path):
    path = write(tmp_path, SIM.replace("noise = 0.0005", "noise = 0.0005\ninitial = [0.0]"))
    assert error(path) == (
        f"{at(path, 'initial =')}: joints.options.initial: 1 values for 3 joints "
        "['shoulder', 'elbow', 'gripper']"
    )
    assert error(None, "joints.options.initial=[0.0, 0.0, 5.0]") == (
        "--set joints.options.initial: joint 'gripper' is outside its stops"
    )


@pytest.mark.parametrize("serve", ["", "robotd.demo.DotFollower", "robotd.demo:", ":P", "a b:C"])
def test_policy_serve_must_be_module_colon_class(serve):
    assert error(None, f'policy.serve="{serve}"').startswith(
        f"--set policy.serve: {serve!r} is not MODULE:CLASS"
    )


def test_policy_serve_of_a_remote_worker_is_not_ours():
    cfg = load_config(None, ['policy.serve=""', 'policy.worker="tcp://gpu:5555"'])
    assert cfg.policy.serve == ""
    assert load_config(None, ['policy.serve="pkg.mod:Outer.Inner"']).policy.serve


# ---- 5: a --set is named as the source of its value ------------------------------------


def test_a_set_driver_option_is_named_as_the_set():
    assert error(None, "joints.options.noise=-1") == (
        "--set joints.options.noise: must be >= 0, got -1"
    )
    assert error(None, "joints.options.nois=1") == "--set joints.options.nois: unknown key"


def test_a_set_unknown_table_is_named_as_the_set():
    assert error(None, "contrl.hz=100") == "--set contrl.hz: contrl: unknown key"
    assert error(None, "control.hzz=100") == "--set control.hzz: unknown key"


def test_a_table_a_set_made_is_named_as_the_set():
    lines = error(None, "cameras.front.fps=30").splitlines()
    assert "--set cameras.front.fps: cameras.front.width: required key is missing" in lines
    assert all(line.startswith("--set cameras.front.fps: ") for line in lines)


def test_a_rule_spanning_sections_blames_the_set():
    assert error(None, "safety.max_velocity=[1.0]") == (
        "--set safety.max_velocity: needs one value per joint (3), got 1"
    )


def test_the_file_is_still_blamed_for_its_own_values(tmp_path):
    path = write(tmp_path, SIM.replace("noise = 0.0005", "noise = -1"))
    noise = at(path, "noise = -1")
    assert error(path, "control.hz=100") == f"{noise}: joints.options.noise: must be >= 0, got -1"


# ---- 6: a driver name typo is reported as such ------------------------------------------


def test_a_joint_driver_typo_comes_before_the_episode_rule(tmp_path):
    path = write(tmp_path, SIM.replace('[joints]\ndriver = "sim"', '[joints]\ndriver = "simm"'))
    typo = at(path, 'driver = "simm"')
    assert error(path) == (
        f"{typo}: joints.driver: unknown driver 'simm' (known: dynamixel, feetech, sim)"
    )


def test_a_camera_driver_typo_comes_before_the_episode_rule():
    assert error(None, 'cameras.top.driver="opencv2"') == (
        "--set cameras.top.driver: unknown driver 'opencv2' (known: opencv, sim)"
    )
