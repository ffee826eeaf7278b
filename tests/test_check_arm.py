"""`robotd check` on a real arm's config (config/so101.toml, config/koch.toml) refuses what
would make `robotd run` die at start, from files alone: a port naming no character
device, a calibration missing, of another arm or putting a joint on another servo ID than
`joints.options.ids`, a baud rate the servos cannot be set to, and a local policy whose
module is not there or whose source binds no such class. Each error names its key and
source; the driver's open says the same sentence. Nothing is opened: a pseudo-terminal
standing for the port gets no byte and keeps its line settings. Real files, real ptys."""

from __future__ import annotations

import os
import select
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.base import DriverContext, DriverFault, build_joints
from drivers.emulators.bus import Emulator
from drivers.servo.calibration import save_calibration
from robotd.check_policy import serve_problem
from robotd.cli import main
from robotd.config import load, load_config
from robotd.errors import ConfigError
from robotd.runtime.emulate import emulated_calibration
from tests.daemon_util import REPO
from tests.lines_util import at

NO_CAMERAS = tuple(f'cameras.{c}.options.fallback="pattern"' for c in ("front", "wrist"))


@pytest.fixture
def pty() -> Iterator[tuple[int, str]]:
    """A pseudo-terminal: (its master, the path of its slave), the slave held open."""
    master, slave = os.openpty()
    try:
        yield master, os.ttyname(slave)
    finally:
        os.close(master)
        os.close(slave)


def arm_config(tmp: Path, name: str, port: str, *, calibrated: bool = True) -> Path:
    """config/NAME copied into tmp with its port set, and (calibrated) a calibration of the
    arm written where the config names it (beside it)."""
    text = (REPO / "config" / name).read_text()
    shipped = "/dev/ttyACM0" if name == "so101.toml" else "/dev/ttyUSB0"
    path = tmp / name
    path.write_text(text.replace(f'port = "{shipped}"', f'port = "{port}"'))
    if calibrated:
        cfg = load_config(path)
        save_calibration(emulated_calibration(cfg), calibration_of(path))
    return path


def calibration_of(config: Path) -> Path:
    return config.parent / config.name.replace(".toml", ".calibration.json")


def check(config: Path, capsys: pytest.CaptureFixture[str], *sets: str) -> tuple[int, str]:
    sets = (f'runtime.dir="{config.parent}/run"', *NO_CAMERAS, *sets)
    code = main(["check", "--config", str(config), *(a for s in sets for a in ("--set", s))])
    return code, capsys.readouterr().err


def opened(config: Path, *sets: str) -> None:
    """What `robotd run` does first with the arm: its driver built and opened."""
    cfg = load_config(config, list(sets))
    context = DriverContext(config_dir=config.parent)
    driver = build_joints(cfg.joints.driver, cfg.joints.names, cfg.joints.options, context)
    try:
        driver.open()
    finally:
        driver.close()


@pytest.mark.parametrize("name", ["so101.toml", "koch.toml"])
def test_a_calibrated_arm_on_a_device_passes_without_a_byte_sent(tmp_path, capsys, pty, name):
    master, port = pty
    before = termios.tcgetattr(master)
    config = arm_config(tmp_path, name, port)
    code, err = check(config, capsys)
    assert (code, err) == (0, "")
    # check has returned: anything it wrote to the port would be waiting at the master
    assert select.select([master], [], [], 0)[0] == []
    assert termios.tcgetattr(master) == before  # never opened, so never configured


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shipped ports are Linux's")
@pytest.mark.parametrize("name", ["so101.toml", "koch.toml"])
def test_the_shipped_arm_configs_fail_here_naming_port_and_calibration(tmp_path, capsys, name):
    shipped = REPO / "config" / name
    port = "/dev/ttyACM0" if name == "so101.toml" else "/dev/ttyUSB0"
    if Path(port).exists() or calibration_of(shipped).exists():
        pytest.skip(f"this machine has {port} or a calibration beside {shipped}")
    code, err = check(shipped, capsys)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 2, err
    assert lines[0].startswith(
        f"robotd: {at(shipped, 'port =')}: joints.options.port: cannot open {port}: "
    )
    assert lines[1].startswith(
        f"robotd: {at(shipped, 'calibration =')}: joints.options.calibration: no calibration at "
        f"{calibration_of(shipped)}: torque stays off until the arm is calibrated"
    )


def test_a_missing_port_is_refused_as_the_driver_refuses_it(tmp_path, capsys):
    gone = tmp_path / "ttyACM7"
    config = arm_config(tmp_path, "so101.toml", str(gone))
    why = f"cannot open {gone}: no such device (is the adapter plugged in?"
    code, err = check(config, capsys)
    assert code == 2 and err.startswith(
        f"robotd: {at(config, 'port =')}: joints.options.port: {why}"
    ), err
    with pytest.raises(DriverFault, match=f"^feetech: {why.replace('(', '.').replace('?', '.')}"):
        opened(config)
    code, err = check(config, capsys, f'joints.options.port="{tmp_path}/ttyUSB3"')
    assert code == 2 and err.startswith("robotd: --set joints.options.port: cannot open "), err


def test_a_port_that_is_no_character_device_is_refused(tmp_path, capsys):
    plain = tmp_path / "ttyUSB0"
    plain.write_text("")
    config = arm_config(tmp_path, "koch.toml", str(plain))
    assert check(config, capsys) == (
        2,
        f"robotd: {at(config, 'port =')}: joints.options.port: cannot open {plain}: "
        "not a serial device "
        "(a regular file)\n",
    )
    code, err = check(config, capsys, f'joints.options.port="{tmp_path}"')
    assert code == 2
    assert err.endswith(f"cannot open {tmp_path}: not a serial device (a directory)\n")


def test_a_by_id_link_to_a_device_is_followed(tmp_path, capsys, pty):
    link = tmp_path / "usb-FTDI_FT232R_USB_UART_A10K-if00-port0"
    link.symlink_to(pty[1])
    assert check(arm_config(tmp_path, "koch.toml", str(link)), capsys) == (0, "")


def test_servo_ids_the_calibration_disagrees_with_are_named_as_the_driver_names_them(
    tmp_path, capsys, pty
):
    config = arm_config(tmp_path, "so101.toml", pty[1])
    cal = calibration_of(config)
    moved = "joints.options.ids=[1, 2, 3, 4, 5, 7]"
    sentence = f"{cal}: joint 'gripper' is servo 6 there, 7 in the config"
    assert check(config, capsys, moved) == (2, f"robotd: --set joints.options.ids: {sentence}\n")
    with pytest.raises(DriverFault, match=f"^feetech: {sentence}$"):
        opened(config, moved)
    # every joint that disagrees, not only the first; the file is blamed when it gave the IDs
    text = config.read_text().replace("ids = [1, 2, 3, 4, 5, 6]", "ids = [6, 5, 4, 3, 2, 1]")
    config.write_text(text)
    code, err = check(config, capsys)
    assert code == 2 and len(err.splitlines()) == 6, err
    assert err.startswith(
        f"robotd: {at(config, 'ids =')}: joints.options.ids: {cal}: joint 'shoulder_pan' "
    )
    # another calibration named by a --set: the disagreement is blamed on that --set
    other = tmp_path / "other.json"
    other.write_text(cal.read_text())
    code, err = check(config, capsys, f'joints.options.calibration="{other}"')
    assert code == 2
    assert err.startswith("robotd: --set joints.options.calibration: joints.options.ids: "), err


def test_a_calibration_of_another_arm_or_unreadable_is_named(tmp_path, capsys, pty):
    config = arm_config(tmp_path, "koch.toml", pty[1])
    so101 = arm_config(tmp_path, "so101.toml", pty[1])
    feetech = calibration_of(so101)
    code, err = check(config, capsys, f'joints.options.calibration="{feetech}"')
    assert (code, err) == (
        2,
        f"robotd: --set joints.options.calibration: {feetech}: a feetech calibration, this "
        "arm is dynamixel\n",
    )
    calibration_of(config).write_text("{not json")
    code, err = check(config, capsys)
    assert code == 2
    assert err.startswith(f"robotd: {at(config, 'calibration =')}: joints.options.calibration: ")
    assert f"{calibration_of(config)}: " in err


def test_a_calibration_without_a_joint_blames_a_set_of_the_names(tmp_path, capsys, pty):
    config = arm_config(tmp_path, "so101.toml", pty[1])
    names = '["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "jaw"]'
    sets = (f"joints.names={names}", 'joints.grippers=["jaw"]', 'joints.options.grippers=["jaw"]')
    code, err = check(config, capsys, *sets)
    assert (code, err) == (
        2,
        f"robotd: --set joints.names: joints.options.calibration: {calibration_of(config)}: "
        "no calibration for joint 'jaw'\n",
    )


@pytest.mark.parametrize(
    ("name", "good", "servos"),
    [("so101.toml", 500_000, "an STS3215"), ("koch.toml", 4_000_000, "an X-series Dynamixel")],
)
def test_a_baud_rate_the_servos_cannot_be_set_to_is_refused_at_load(tmp_path, name, good, servos):
    config = arm_config(tmp_path, name, "/dev/null", calibrated=False)
    with pytest.raises(ConfigError) as info:
        load(config, ["joints.options.baud=1234"])
    assert str(info.value).startswith(
        f"--set joints.options.baud: 1234 is not a rate {servos} can be set to ("
    )
    assert f"{good}" in str(info.value)
    load(config, [f"joints.options.baud={good}"])
    text = config.read_text().replace("baud = 1000000", "baud = 1200000")
    config.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(config)
    assert str(info.value).startswith(
        f"{at(config, 'baud =')}: joints.options.baud: 1200000 is not"
    )


def test_the_emulated_arm_check_passed_opens(tmp_path, capsys):
    with Emulator("feetech", (1, 2, 3, 4, 5, 6)).start() as emu:
        config = arm_config(tmp_path, "so101.toml", emu.port)
        assert check(config, capsys) == (0, "")
        assert emu.instructions == 0  # check said nothing on the bus
        opened(config)
        assert emu.instructions > 0


# ---- the local worker's policy ---------------------------------------------------------


@pytest.mark.parametrize(
    ("serve", "why"),
    [
        ("nosuchmod:Wave", "cannot import module 'nosuchmod': No module named 'nosuchmod'"),
        ("robotd.nosuch:Wave", "cannot import module 'robotd.nosuch': No module named "
         "'robotd.nosuch'"),
        ("robotd.demo:Wav", "'robotd.demo' has no attribute 'Wav' (did you mean 'Wave'?)"),
    ],
)  # fmt: skip
def test_a_policy_that_is_not_there_is_refused(tmp_path, capsys, pty, serve, why):
    config = arm_config(tmp_path, "so101.toml", pty[1])
    sentence = f"'{serve}': {why}"
    assert check(config, capsys, f'policy.serve="{serve}"') == (
        2,
        f"robotd: --set policy.serve: {sentence}\n",
    )
    config.write_text(config.read_text().replace('"robotd.demo:Wave"', f'"{serve}"'))
    assert check(config, capsys) == (
        2,
        f"robotd: {at(config, 'serve =')}: policy.serve: {sentence}\n",
    )
    # a remote worker serves what it was started with: not judged
    remote = 'policy.worker="stream+tcp://gpu-box:5555"'
    assert check(config, capsys, remote) == (0, "")


def test_a_policy_module_is_found_not_run(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    pkg = tmp_path / "mypolicies"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (pkg / "arm.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "try:\n    from numpy import ndarray as Frame\nexcept ImportError:\n    Frame = None\n"
        "class Grasp:\n    pass\n"
    )
    (pkg / "lazy.py").write_text("def __getattr__(name):\n    return type(name, (), {})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert serve_problem("mypolicies.arm:Grasp") is None
    assert serve_problem("mypolicies.arm:Frame") is None  # bound in a try block
    assert serve_problem("mypolicies.arm:Grap") == (
        "'mypolicies.arm' has no attribute 'Grap' (did you mean 'Grasp'?)"
    )
    assert serve_problem("mypolicies.lazy:Anything") is None  # a module __getattr__: not judged
    assert serve_problem("mypolicies:arm") is None  # a submodule, once imported
    assert serve_problem("mypolicies.gone:X") == (
        "cannot import module 'mypolicies.gone': No module named 'mypolicies.gone'"
    )
    assert not marker.exists()  # neither the package nor its module was run
    assert "mypolicies" not in sys.modules


def test_a_policy_beside_the_working_directory_is_found_as_the_worker_finds_it(
    tmp_path, monkeypatch
):
    # the local worker is `python -m robotd serve`: its working directory is on its path
    (tmp_path / "here_policy.py").write_text("class Here:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    assert serve_problem("here_policy:Here") is None
    assert serve_problem("here_policy:There") == (
        "'here_policy' has no attribute 'There' (did you mean 'Here'?)"
    )
