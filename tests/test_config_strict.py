"""Config loading is strict and honest: a section's own rules are named by their dotted key
and blamed on the source that gave the value, every error is reported at once (non-finite
numbers with the rest), values are not coerced from another kind, bounds catch typos, names
used as keys are names, and a byte-order mark is no statement."""

from __future__ import annotations

import enum
import typing
from datetime import date, datetime, time
from pathlib import PurePath
from typing import Any

import pytest
from pydantic import BaseModel

from robotd.config import Config, load_config
from robotd.config.policy import HANG_MIN_S
from tests.config_util import SIM, error, write
from tests.lines_util import at

# ---- 1: a section's own rules, dotted and blamed on their source ------------------------


def test_a_joints_rule_set_by_a_set_names_the_set_and_the_dotted_key():
    assert error(None, "joints.upper=[2.8, 2.8]") == (
        "--set joints.upper: needs one value per joint (3), got 2"
    )
    assert error(None, "joints.lower=[3.0, -2.8, 0.0]") == (
        "--set joints.lower[0]: joint 'shoulder' has lower 3 >= upper 2.8"
    )
    # the rule is about two keys: the first is named, after the --set that gave the other
    assert error(None, "joints.upper=[-3.0, 2.8, 1.0]") == (
        "--set joints.upper: joints.lower[0]: joint 'shoulder' has lower -2.8 >= upper -3"
    )


def test_a_joints_rule_in_the_file_names_the_file_and_every_problem(tmp_path):
    text = SIM.replace("upper = [2.8, 2.8, 1.0]", "upper = [2.8, 1.0]")
    path = write(tmp_path, text.replace('grippers = ["gripper"]', 'grippers = ["claw"]'))
    assert error(path).splitlines() == [
        f"{at(path, 'upper =')}: joints.upper: needs one value per joint (3), got 2",
        f"{at(path, 'grippers =')}: joints.grippers: ['claw'] are not joint names "
        "['shoulder', 'elbow', 'gripper']",
    ]


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            'policy.worker="zmq://gpu:5555"',
            "--set policy.worker: 'zmq://gpu:5555': a robotd worker listens on",
        ),
        (
            'runtime.control_endpoint="ftp://x"',
            "--set runtime.control_endpoint: 'ftp://x': only ipc:// and tcp:// endpoints",
        ),
    ],
)
def test_other_sections_own_rules_are_dotted_and_blamed_on_the_set(override, line):
    assert error(None, override).startswith(line)


def test_a_contract_rule_is_blamed_on_the_set_that_declared_it():
    assert error(None, "policy.observations={streams={top={at=[3,0]}}}") == (
        "--set policy.observations.streams['top'].at: offset 3 > 0 (offsets must be <= 0)"
    )


def test_rules_spanning_sections_are_all_reported():
    lines = error(
        None, 'control.timing="sync"', 'control.merge="fade"', "safety.max_velocity=[1.0]"
    ).splitlines()
    assert lines[0].startswith("--set control.merge: 'fade' blends chunks in realtime")
    assert lines[1] == "--set safety.max_velocity: needs one value per joint (3), got 1"


# ---- 2: non-finite numbers reported with the file's other errors -------------------------


def test_a_nan_is_reported_together_with_the_other_errors(tmp_path):
    text = SIM.replace("hz = 30", "hz = -5").replace("spin_us = 200", "ensemble_decay = nan")
    path = write(tmp_path, text.replace("noise = 0.0005", "noise = -1"))
    assert error(path).splitlines() == [
        f"{at(path, 'ensemble_decay =')}: control.ensemble_decay: must be a finite number, got nan",
        f"{at(path, 'hz =')}: control.hz: must be > 0, got -5",
        f"{at(path, 'noise =')}: joints.options.noise: must be >= 0, got -1",
    ]


def test_a_non_finite_value_is_said_once_wherever_it_is():
    lines = error(None, "control.hz=nan", "joints.options.noise=inf", "policy.timeout_s=0")
    assert lines.splitlines() == [
        "--set control.hz: must be a finite number, got nan",
        "--set joints.options.noise: must be a finite number, got inf",
        "--set policy.timeout_s: must be > 0, got 0",
    ]
    assert error(None, "policy.observations={streams={top={at=[nan, 0]}}}") == (
        "--set policy.observations.streams.top.at[0]: must be a finite number, got nan"
    )


# ---- 3: upper bounds that catch typos ---------------------------------------------------


@pytest.mark.parametrize(
    ("key", "bound"),
    [
        ("control.ensemble_decay", 10),
        ("control.latency_s", 60),
        ("control.stats_interval_s", 10),
        ("cameras.top.max_age_ms", 10_000),
        ("policy.timeout_s", 600),
    ],
)
def test_an_upper_bound_takes_its_bound_and_refuses_past_it(key, bound):
    cfg = load_config(None, [f"{key}={bound}"])
    section, *rest = key.split(".")
    value: Any = getattr(cfg, section)
    for part in rest:
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    assert value == bound
    assert error(None, f"{key}=1e9") == f"--set {key}: must be <= {bound}, got 1000000000.0"


# ---- 4: strict kinds: a TOML bool is no number, a string no bool ------------------------


@pytest.mark.parametrize(
    ("old", "new", "line"),
    [
        ("hz = 30", "hz = true", "control.hz: must be a number, got True"),
        (
            "lock_memory = true",
            'lock_memory = "no"',
            "control.lock_memory: must be true or false, got 'no'",
        ),
        ("spin_us = 200", "spin_us = 200.0", "control.spin_us: must be an integer, got 200.0"),
        ("timeout_s = 10", 'timeout_s = "10"', "policy.timeout_s: must be a number, got '10'"),
        ("tau_s = 0.05", "tau_s = true", "joints.options.tau_s: must be a number, got True"),
        ("", "[trace]\nfsync = 1\n", "trace.fsync: must be true or false, got 1"),
    ],
)
def test_a_value_of_another_kind_is_refused_not_coerced(tmp_path, old, new, line):
    assert old in SIM
    text = SIM.replace(old, new, 1) if old else f"{SIM}\n{new}"  # "": a table at the end
    path = write(tmp_path, text)
    assert error(path) == f"{at(path, new.splitlines()[-1])}: {line}"


def test_an_integer_is_a_floats_value(tmp_path):
    cfg = load_config(write(tmp_path, SIM.replace("timeout_s = 10", "timeout_s = 2")))
    assert type(cfg.control.hz) is float and cfg.control.hz == 30  # the file's hz = 30
    assert type(cfg.policy.timeout_s) is float and cfg.policy.timeout_s == 2


@pytest.mark.parametrize(
    ("override", "read", "want"),
    [
        ("control.hz=100", lambda c: c.control.hz, 100.0),
        ("control.hz=62.5", lambda c: c.control.hz, 62.5),
        ("control.lock_memory=false", lambda c: c.control.lock_memory, False),
        ("control.spin_us=150", lambda c: c.control.spin_us, 150),
        ("control.timing=realtime", lambda c: c.control.timing, "realtime"),  # a bare word
        ('control.timing="sync"', lambda c: c.control.timing, "sync"),
        ("control.refill_steps=auto", lambda c: c.control.refill_steps, "auto"),
        ("control.refill_steps=4", lambda c: c.control.refill_steps, 4),
        ("control.latency_s=0.5", lambda c: c.control.latency_s, 0.5),
        ('robot.name="arm 2"', lambda c: c.robot.name, "arm 2"),
        ('joints.names=["a", "b", "gripper"]', lambda c: c.joints.names, ["a", "b", "gripper"]),
        ("safety.max_velocity=[1, 2, 3]", lambda c: c.safety.max_velocity, [1.0, 2.0, 3.0]),
        ("joints.options.noise=0", lambda c: c.joints.options["noise"], 0),
        ("cameras.top.options.view=wrist", lambda c: c.cameras["top"].options["view"], "wrist"),
        ("policy.args={rtc=false}", lambda c: c.policy.args, {"rtc": False}),
        ("trace.ticks=3", lambda c: c.trace.ticks, 3),
        ("trace.fsync=false", lambda c: c.trace.fsync, False),
        ("runtime.telemetry_hz=5", lambda c: c.runtime.telemetry_hz, 5.0),
    ],
)
def test_a_set_of_every_kind_still_loads(override, read, want):
    value = read(load_config(None, [override]))
    assert value == want and type(value) is type(want)


def test_a_set_in_words_is_refused_like_the_file():
    assert error(None, "control.lock_memory=no") == (
        "--set control.lock_memory: must be true or false, got 'no'"
    )
    assert error(None, "control.hz=true") == "--set control.hz: must be a number, got True"


# What strict validation refuses from every TOML value (an array is no tuple, a string no
# Path, Enum or date): a field of such a type could never be set from a config file.
_NOT_TOML = (tuple, set, frozenset, PurePath, enum.Enum, date, datetime, time, bytes)


def _annotations(model: type[BaseModel], seen: set[type]) -> typing.Iterator[Any]:
    if model in seen:
        return
    seen.add(model)
    for field in model.model_fields.values():
        stack = [field.annotation]
        while stack:
            kind = stack.pop()
            yield kind
            stack += typing.get_args(kind)
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from _annotations(kind, seen)


def test_every_config_field_has_a_type_toml_spells():
    bad = []
    for kind in _annotations(Config, set()):
        origin = typing.get_origin(kind) or kind
        if isinstance(origin, type) and issubclass(origin, _NOT_TOML):
            bad.append(kind)
    assert not bad, f"strict loading refuses every TOML value for {bad}"


# ---- 5: a byte-order mark -----------------------------------------------------------------


def test_a_leading_byte_order_mark_is_taken(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + SIM.encode())
    assert load_config(path) == load_config(None)
    path.write_bytes(b"\xef\xbb\xbf" + SIM.replace("hz = 30", "hz = -5").encode())
    assert error(path) == f"{at(path, 'hz =')}: control.hz: must be > 0, got -5"


# ---- 6: names used as keys ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["", " ", "\t"])
def test_an_empty_or_blank_joint_name_is_refused(name):
    assert error(None, f'joints.names=["shoulder", "{name}", "gripper"]') == (
        f"--set joints.names[1]: a name must not be empty or only blanks, got {name!r}"
    )


def test_a_duplicate_joint_or_gripper_name_is_refused(tmp_path):
    path = write(tmp_path, SIM.replace('"gripper"]\ngrippers', '"shoulder"]\ngrippers'))
    assert error(path) == (
        f"{at(path, 'names =')}: joints.names: duplicate joint name 'shoulder' (at [0] and [2])"
    )
    assert error(None, 'joints.grippers=["gripper", "gripper"]') == (
        "--set joints.grippers: duplicate gripper 'gripper' (at [0] and [1])"
    )


@pytest.mark.parametrize("name", ["", " "])
def test_an_empty_or_blank_camera_name_is_refused(tmp_path, name):
    text = SIM.replace("[cameras.wrist]", f'[cameras."{name}"]')
    text = text.replace("[cameras.wrist.options]", f'[cameras."{name}".options]')
    path = write(tmp_path, text)
    assert f"{path}: cameras.{name!r}: a camera name must be alphanumeric" in error(path)


# ---- 7: policy.hang_s's floor -------------------------------------------------------------


def test_a_hang_s_shorter_than_any_act_is_refused():
    assert error(None, "policy.hang_s=1e-9").startswith(
        f"--set policy.hang_s: must be >= {HANG_MIN_S:g} s, got 1e-09: shorter, a copy still "
        "computing an ordinary act would be killed as hung"
    )
    assert load_config(None, [f"policy.hang_s={HANG_MIN_S}"]).policy.hang_s == HANG_MIN_S


def test_a_short_patience_keeps_the_hang_floor_and_an_explicit_hang_s_must_be_shorter():
    # 3 / 30 Hz = 0.1 s: a stall ends the episode 'starved' first; copies are not killed
    # for computing an ordinary act (the floor holds)
    assert load_config(None, ["control.max_hold_steps=1"]).policy.hang_s == HANG_MIN_S
    assert load_config(None, ["control.max_hold_steps=3"]).policy.hang_s == HANG_MIN_S
    assert error(None, "control.max_hold_steps=3", "policy.hang_s=0.2").startswith(
        "--set policy.hang_s: 0.2 s is not shorter than the robot's patience, "
        "control.max_hold_steps / control.hz = 3 / 30 Hz = 0.1 s"
    )
    # 5 / 30 Hz = 0.167 s: half of it would be under the floor; the cap stays on the floor
    assert load_config(None, ["control.max_hold_steps=5"]).policy.hang_s == HANG_MIN_S
    # a remote worker's hangs are its own business
    remote = load_config(None, ["control.max_hold_steps=3", 'policy.worker="tcp://gpu:5555"'])
    assert remote.control.max_hold_steps == 3
