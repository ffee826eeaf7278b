"""Config errors name the line of the file that gives the bad key (FILE:LINE: key: rule),
found by tomllib itself; what the file cannot place keeps its line-less form."""

from __future__ import annotations

from pathlib import Path

import pytest

from robotd.config.lines import MAX_LINES, key_lines, line_of, with_lines
from robotd.config.load import load
from robotd.errors import ConfigError

TEXT = '''# a robot
[control]
hz = 30.0

[joints]
driver = "sim"
names = [
    "a",
    "b",
]
options = { tau_s = 0.01, limit = "x" }
notes = """
hz = 1
[fake]
"""

[[runtime.hooks]]
name = "one"

[[runtime.hooks]]
name = "two"
'''


def test_every_key_is_placed_at_the_line_that_gives_it() -> None:
    lines = key_lines(TEXT)
    assert lines["control"] == 2 and lines["control.hz"] == 3
    assert lines["joints.driver"] == 6
    assert lines["joints.names"] == 10  # a multi-line array: the line that closes it
    assert lines["joints.options.limit"] == 11  # inside an inline table
    assert lines["joints.notes"] == 15  # a multi-line string's own lines are not keys
    assert "fake" not in lines and lines["runtime.hooks[1].name"] == 21


def test_a_missing_key_is_placed_at_the_nearest_table_the_file_has() -> None:
    lines = key_lines(TEXT)
    assert line_of("joints.options.nope", lines) == 11
    assert line_of("runtime.hooks[0].missing", lines) == 17
    assert line_of("cameras.top.fps", lines) is None  # nothing of it in the file


def test_lines_about_a_set_or_the_whole_file_are_left_alone() -> None:
    message = "\n".join(
        [
            "x.toml: control.hz: must be > 0, got -5",
            "--set control.hz: must be > 0",
            "x.toml: not valid TOML: oops",
            "x.toml: cameras.top: required key is missing",
        ]
    )
    assert with_lines(message, "x.toml", TEXT).split("\n") == [
        "x.toml:3: control.hz: must be > 0, got -5",
        "--set control.hz: must be > 0",
        "x.toml: not valid TOML: oops",
        "x.toml: cameras.top: required key is missing",
    ]


def test_a_file_too_long_to_place_keeps_its_errors_without_lines() -> None:
    text = "".join(f"k{i} = {i}\n" for i in range(MAX_LINES + 1))
    assert key_lines(text) == {}
    assert with_lines("x.toml: k3: bad", "x.toml", text) == "x.toml: k3: bad"


def test_a_loaded_file_names_the_line_of_each_bad_key(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    joints = '[joints]\ndriver = "sim"\nnames = ["a"]\nlower = [0.0]\nupper = [1.0]\n'
    path.write_text(f'[control]\nhz = "fast"\n\n{joints}nope = 1\n')
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).split("\n") == [
        f"{path}:2: control.hz: must be a number, got 'fast'",
        f"{path}:9: joints.nope: unknown key",
    ]


def test_a_set_is_still_blamed_by_name_not_by_a_line(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    joints = '[joints]\ndriver = "sim"\nnames = ["a"]\nlower = [0.0]\nupper = [1.0]\n'
    path.write_text(f"[control]\nhz = 30.0\n\n{joints}")
    with pytest.raises(ConfigError, match=r"^--set control\.hz: must be > 0, got -5$"):
        load(path, ["control.hz=-5"])
