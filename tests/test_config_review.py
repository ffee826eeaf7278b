"""A hostile user's config mistakes, each answered with one line naming the key and its
source and never a traceback: malformed URLs, nesting past any robot's config, a value of
the wrong container kind or a TOML date, a rule brought into force by a --set blamed on
it, every openpi rule broken at once, and unions that say what they want once."""

from __future__ import annotations

from pathlib import Path

import pytest

from drivers.opencv.camera import OpenCVOptions
from drivers.opencv.options import source_problem
from robotd.config import DEFAULT_CONFIG, load_config
from robotd.errors import ConfigError
from tests.lines_util import at

SIM = DEFAULT_CONFIG.read_text()
DROID = (DEFAULT_CONFIG.parent / "openpi-droid.toml").read_text()


def error(path: Path | None, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, list(overrides))
    return str(err.value)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.toml"
    path.write_text(text)
    return path


def test_a_camera_url_with_an_unclosed_ipv6_host_is_one_line_hiding_its_password(tmp_path):
    options = OpenCVOptions(source="http://user:secret@[::1/x")
    problem = source_problem(options, tmp_path)
    assert problem == "source: http://***@[::1/x: a malformed URL (Invalid IPv6 URL)"


def test_an_openpi_worker_with_an_unclosed_ipv6_host_names_policy_worker(tmp_path):
    path = write(tmp_path, DROID.replace("ws://127.0.0.1:8000", "ws://[::1:8000"))
    assert error(path) == (
        f"{at(path, 'worker =')}: policy.worker: 'ws://[::1:8000' is not a URL (Invalid IPv6 URL)"
    )


def test_arrays_nested_past_the_parser_stack_are_refused_not_a_traceback(tmp_path):
    deep = "[" * 3000 + "]" * 3000
    path = write(tmp_path, SIM.replace("args = { latency_ms = 0 }", f"args = {{ d = {deep} }}"))
    assert error(path) == f"{path}: not valid TOML: tables and arrays nested more than 64 deep"
    assert error(None, f"policy.args.d={deep}") == (
        "--set policy.args.d: tables and arrays nested more than 64 deep"
    )


def test_tables_nested_past_the_limit_name_the_key_before_anything_recurses(tmp_path):
    path = write(tmp_path, SIM + "\n[runtime" + ".a" * 500 + "]\nx = 1\n")
    text = error(path)
    assert text.startswith(f"{path}: runtime.a.a.a")
    assert text.endswith("...: tables and arrays nested more than 64 deep")


def test_a_wrong_container_kind_says_table_or_array_not_pydantic_class_names(tmp_path):
    assert error(None, "cameras.top=5") == "--set cameras.top: must be a table, got 5"
    assert error(None, "joints.lower=5") == "--set joints.lower: must be an array, got 5"
    assert error(None, "control.hz=[1]") == "--set control.hz: must be a number, got an array"
    path = write(tmp_path, SIM.replace("[cameras.wrist]\n", "[[cameras.wrist]]\n"))
    wrist = at(path, "[[cameras.wrist]]")
    assert f"{wrist}: cameras.wrist: must be a table, got an array of tables" in error(path)


def test_a_toml_date_is_shown_as_written_not_as_a_python_repr():
    assert error(None, "robot.name=2024-01-01") == (
        "--set robot.name: must be a string, got 2024-01-01 (a TOML date or time)"
    )


def test_a_set_of_the_joint_names_is_blamed_for_the_grippers_it_orphans():
    assert error(None, 'joints.names=["a", "b", "c"]') == (
        "--set joints.names: joints.grippers: ['gripper'] are not joint names ['a', 'b', 'c']"
    )


def test_a_set_of_the_joint_names_is_blamed_for_the_limits_that_no_longer_fit():
    said = error(None, 'joints.names=["a", "b"]')
    assert "--set joints.names: joints.lower: needs one value per joint (2), got 3" in said
    assert "--set joints.names: joints.upper: needs one value per joint (2), got 3" in said


def test_a_set_that_makes_the_robot_real_is_blamed_for_its_episode_start():
    camera = 'cameras.extra={driver="opencv", width=64, height=48, fps=30}'
    rule = "'episode' (start moving by itself) is allowed for simulated robots"
    assert f"--set cameras.extra: robot.start: {rule}" in error(None, camera)
    assert f"--set joints.driver: robot.start: {rule}" in error(None, 'joints.driver="dynamixel"')
    assert f"--set robot.start: {rule}" in error(None, camera, 'robot.start="episode"')


def test_a_set_of_the_joint_names_is_blamed_for_the_servo_ids_that_no_longer_fit():
    koch = DEFAULT_CONFIG.parent / "koch.toml"
    sets = ['joints.names=["a", "b", "c"]', "joints.lower=[0, 0, 0]", "joints.upper=[1, 1, 1]"]
    sets += ["joints.grippers=[]", "safety.max_velocity=[1, 1, 1]"]
    assert error(koch, *sets) == (
        "--set joints.names: joints.options.ids: one servo ID per joint (3: ['a', 'b', 'c']), "
        "got 6"
    )


def test_a_set_that_makes_the_link_openpi_is_blamed_for_the_rules_it_brings():
    assert error(None, "policy.link=openpi") == (
        "--set policy.link: policy.worker: the openpi link needs a ws:// or wss:// endpoint "
        "(e.g. ws://gpu-box:8000), got ''\n"
        "--set policy.link: policy.openpi.inputs: map at least one observation key"
    )


def test_every_openpi_rule_broken_is_reported_at_once(tmp_path):
    text = DROID.replace('source = "exterior"', 'source = "extrior"')
    path = write(tmp_path, text.replace('columns = "0:8"', 'columns = "0:9"'))
    typo, columns = at(path, 'source = "extrior"'), at(path, "columns =")
    assert error(path).splitlines() == [
        f"{typo}: policy.openpi.inputs[0].source: 'extrior' is not one of "
        "['exterior', 'wrist', 'joints.pos', 'joints.vel', 'task']",
        f"{columns}: policy.openpi.actions.columns: selects 9 columns for the robot's 8 joints",
    ]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("[7.0]", "must be a slice 'start:stop' or an array of indices (integers), got [7.0]"),
        ("[-1]", "indices must be 0..1023, got [-1]"),
    ],
)
def test_an_openpi_joint_selection_says_once_what_it_wants(tmp_path, value, why):
    path = write(tmp_path, DROID.replace("joints = [7]", f"joints = {value}"))
    assert error(path) == f"{at(path, f'joints = {value}')}: policy.openpi.inputs[3].joints: {why}"


def test_an_openpi_server_key_of_another_kind_says_once_what_it_wants():
    inputs = 'policy.openpi.inputs=[{key = 5, source = "top"}]'
    assert error(None, inputs) == (
        "--set policy.openpi.inputs[0].key: must be a string or an array of strings, got 5"
    )


def test_a_set_by_array_index_is_refused_saying_so():
    assert error(None, "joints.lower[0]=1") == (
        "--set joints.lower[0]: an array's entry cannot be set by its index; set the whole "
        "array (e.g. joints.lower=[-1.0, -2.0])"
    )
