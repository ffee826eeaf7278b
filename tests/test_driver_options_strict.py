"""Driver options are taken as written, not converted: a union of kinds (opencv's `source`,
a device index or a path) takes neither a bool nor a float, a Literal of mode numbers no
float, a safety category no bool, whether through the config loader or a driver built from
Python; a plugin's lax model still has its scalars checked at load; and every shipped config
still loads."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from drivers.base import (
    CameraSpec,
    DriverConfigError,
    DriverContext,
    DriverOptions,
    build_camera,
    driver_class,
    validate_options,
)
from drivers.opencv.camera import OpenCVCamera
from robotd.config import load_config
from robotd.config.strict import validate_strictly
from robotd.errors import ConfigError
from tests.lines_util import at

ROOT = Path(__file__).resolve().parent.parent
KOCH = ROOT / "config" / "koch.toml"
# the koch and so101 cameras are USB devices this machine may not have: the pattern serves
PATTERN = ['cameras.front.options.fallback="pattern"', 'cameras.wrist.options.fallback="pattern"']


def error(path: Path | None, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, list(overrides))
    return str(err.value)


@pytest.mark.parametrize(
    ("value", "shown"), [("true", "True"), ("false", "False"), ("1.0", "1.0"), ("[0]", "[0]")]
)
def test_an_opencv_source_of_another_kind_is_one_refusal_naming_the_key(value, shown):
    assert error(KOCH, *PATTERN, f"cameras.front.options.source={value}") == (
        "--set cameras.front.options.source: must be a device index (an integer) or a path "
        f"or URL (a string), got {shown}"
    )


def test_a_bool_source_in_the_file_is_blamed_on_the_file(tmp_path):
    path = tmp_path / "koch.toml"
    path.write_text(KOCH.read_text().replace("source = 0", "source = true", 1))
    key = f"{at(path, 'source = true')}: cameras.front.options.source"
    assert error(path, *PATTERN) == (
        f"{key}: must be a device index (an integer) or a path or URL (a string), got True"
    )


@pytest.mark.parametrize("source", [0, 3, "/dev/video0", "rtsp://cam.local/stream", "clip.mp4"])
def test_an_opencv_source_of_either_kind_loads_as_written(source):
    written = f'"{source}"' if isinstance(source, str) else str(source)
    cfg = load_config(KOCH, [*PATTERN, f"cameras.front.options.source={written}"])
    options = validate_options(OpenCVCamera, cfg.cameras["front"].options)
    assert options.source == source and type(options.source) is type(source)


def test_a_driver_built_from_python_refuses_another_kind_too():
    with pytest.raises(pydantic.ValidationError, match="a device index"):
        validate_options(OpenCVCamera, {"source": True})
    with pytest.raises(pydantic.ValidationError, match="Input should be a valid boolean"):
        validate_options(OpenCVCamera, {"loop": 1})


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("joints.options.operating_mode=3.0", "must be an integer (3, 4 or 5), got 3.0"),
        ("joints.options.gripper_operating_mode=true", "must be an integer (3, 4 or 5), got True"),
        ("joints.options.baud=1e6", "must be an integer, got 1000000.0"),
        ("joints.options.low_latency=1", "must be true or false, got 1"),
    ],
)
def test_a_servo_option_of_another_kind_is_refused(override, line):
    key = override.partition("=")[0]
    assert error(KOCH, *PATTERN, override) == f"--set {key}: {line}"


def test_a_servo_mode_written_as_an_integer_loads():
    cfg = load_config(KOCH, [*PATTERN, "joints.options.operating_mode=4"])
    assert cfg.joints.options["operating_mode"] == 4


@pytest.mark.parametrize(("value", "shown"), [("true", "True"), ("0.0", "0.0")])
def test_an_estop_category_of_another_kind_is_refused(value, shown):
    # a Literal[0, 1] would take true for 1 and 0.0 for 0
    assert error(None, f"safety.estop_category={value}") == (
        f"--set safety.estop_category: must be an integer (0 or 1), got {shown}"
    )
    assert load_config(None, ["safety.estop_category=0"]).safety.estop_category == 0


class _LaxPlugin(DriverOptions):
    """A plugin's options holding a Path (strict mode takes none from a TOML string)."""

    model_config = pydantic.ConfigDict(strict=False)
    where: Path = Path(".")
    count: int = 1


def test_a_plugin_that_opts_out_of_strict_keeps_its_path_and_its_scalars_checked():
    validated, errors = validate_strictly(_LaxPlugin, {"where": "/tmp/x"})
    assert not errors and validated is not None and validated.where == Path("/tmp/x")
    validated, errors = validate_strictly(_LaxPlugin, {"where": "/tmp/x", "count": True})
    assert validated is None and [(e["loc"], e["type"]) for e in errors] == [
        (("count",), "int_type")
    ]


@pytest.mark.parametrize(
    "config", [*sorted(p.name for p in (ROOT / "config").glob("*.toml")), "data/sim.toml"]
)
def test_every_shipped_config_still_loads(config):
    path = ROOT / "robotd" / config if config.startswith("data/") else ROOT / "config" / config
    has_usb = "opencv" in path.read_text()
    cfg = load_config(path, PATTERN if has_usb else [])
    for cam in cfg.cameras.values():  # the options as the drivers will take them
        validate_options(driver_class("cameras", cam.driver), cam.options)
    assert cfg.joints.names


def test_a_build_with_a_bool_source_names_the_key():
    with pytest.raises(DriverConfigError, match=r"cameras\.top\.options\.source: must be a"):
        build_camera("opencv", CameraSpec("top", 8, 6, 5.0), {"source": True}, DriverContext())
