"""`robotd check --probe` on the shipped arm configs (config/koch.toml, config/so101.toml)
against the servo bus emulator on a pseudo-terminal, opened by real pyserial: every
configured servo pinged and read (model, position against the calibrated range), every
problem named (joint, ID, value read), a silent ID answered with the IDs a scan of the bus
found, replies that are not well formed turned into named verdicts, a port held or absent
said with its errno; and nothing but PING and READ ever reaches the bus."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import serial

from drivers.emulators.bus import Emulator
from drivers.servo.calibration import load_calibration, save_calibration
from drivers.servo.probe import open_bus
from drivers.servo.transport import TransportError
from robotd.check_probe import open_problem
from robotd.cli import main
from robotd.config import load
from tests.daemon_util import REPO
from tests.lines_util import at
from tests.test_check_arm import NO_CAMERAS, arm_config, calibration_of

ARMS = {"dynamixel": "koch.toml", "feetech": "so101.toml"}
NAMES = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
PING, READ = 0x01, 0x02  # the same codes in both families


def arm(protocol: str, ids: tuple[int, ...] = (1, 2, 3, 4, 5, 6), **kw: Any) -> Emulator:
    """The emulator of the shipped arm: its servos of the models its config names (per ID,
    by its place; past 6, the last joint's), unless `model` says otherwise."""
    if "model" not in kw:
        models = load(REPO / "config" / ARMS[protocol]).config.joints.options["models"]
        kw["model"] = [models[min(i, len(models)) - 1] for i in ids]
    return Emulator(protocol, ids, **kw)


def probe(config: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    sets = (f'runtime.dir="{config.parent}/run"', *NO_CAMERAS)
    argv = ["check", "--config", str(config), "--probe", *args]
    code = main(argv + [a for s in sets for a in ("--set", s)])
    out, err = capsys.readouterr()
    return code, out, err


def read_only(emu: Emulator) -> set[int]:
    """The instructions the emulator got, asserted to be pings and reads only."""
    instructions = {inst for _, inst in emu.received}
    assert instructions <= {PING, READ}, emu.received
    return instructions


def report(out: str) -> dict:
    """The --json report: one object, the last line."""
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("protocol", ["dynamixel", "feetech"])
def test_a_good_arm_passes_with_a_table_and_nothing_written(tmp_path, capsys, protocol):
    with arm(protocol).start() as emu:
        config = arm_config(tmp_path, ARMS[protocol], emu.port)
        code, out, err = probe(config, capsys)
        assert (code, err) == (0, ""), out
        assert read_only(emu) == {PING, READ}
        scanned = {ident for ident, _ in emu.received}
    assert scanned == {1, 2, 3, 4, 5, 6}  # all answered: no scan
    models = ["xl430-w250 (1060)"] * 2 + ["xl330-m288 (1200)"] * 4  # the Koch follower's
    for name, model in zip(NAMES, models if protocol == "dynamixel" else ["sts3215 (777)"] * 6):
        row = next(line for line in out.splitlines() if f" {name} " in line)
        assert model in row and " 2048 " in row and row.rstrip(" │|").endswith("ok"), row
    assert "read only" in out and "probe: all well" in out


def test_the_json_report_is_one_object_on_the_last_line(tmp_path, capsys):
    with arm("feetech").start() as emu:
        config = arm_config(tmp_path, "so101.toml", emu.port)
        code, out, err = probe(config, capsys, "--json")
    assert (code, err, len(out.splitlines())) == (0, "", 1)
    got = report(out)
    assert {k: got[k] for k in ("ok", "probed", "port", "protocol", "scan", "problems")} == {
        "ok": True, "probed": True, "port": emu.port, "protocol": "feetech", "scan": None,
        "problems": [],
    }  # fmt: skip
    cal = load_calibration(calibration_of(config))
    assert [j["joint"] for j in got["joints"]] == list(NAMES)
    for j, ident in zip(got["joints"], range(1, 7)):
        c = cal.joints[j["joint"]]
        assert j == {
            "joint": j["joint"], "id": ident, "answered": True, "model": 777,
            "model_name": "sts3215", "present": 2048, "position": 2048,
            "range": [c.range_min, c.range_max], "ok": True, "verdict": "ok",
        }  # fmt: skip


def test_a_missing_id_is_named_beside_the_ids_a_scan_found(tmp_path, capsys):
    with arm("dynamixel", (1, 2, 4, 5, 6, 9)).start() as emu:
        config = arm_config(tmp_path, "koch.toml", emu.port)
        started = time.monotonic()
        code, out, err = probe(config, capsys, "--json")
        took = time.monotonic() - started
        read_only(emu)
        asked = {ident for ident, _ in emu.received}
    assert code == 2
    assert err == (
        f"robotd: {at(config, 'ids =')}: joints.options.ids: joint 'elbow_flex' id 3: no "
        "answer; on the bus: ids 1, 2, 4, 5, 6, 9\n"
    )
    got = report(out)
    assert got["scan"] == {"found": [1, 2, 4, 5, 6, 9], "last_id": 252, "stopped_at": None}
    assert asked == set(range(253))  # every Protocol 2.0 ID, once the scan ran
    assert [j["ok"] for j in got["joints"]] == [True, True, False, True, True, True]
    assert took < 15  # bounded: per-ID deadlines, and the scan's own budget


def test_no_scan_names_the_missing_ids_and_asks_only_the_configured_ones(tmp_path, capsys):
    with arm("feetech", (1, 2, 3, 5)).start() as emu:
        config = arm_config(tmp_path, "so101.toml", emu.port)
        code, out, err = probe(config, capsys, "--no-scan")
        read_only(emu)
        asked = {ident for ident, _ in emu.received}
    assert code == 2 and asked == {1, 2, 3, 4, 5, 6}
    blame = f"robotd: {at(config, 'ids =')}: joints.options.ids"
    assert err.splitlines() == [
        f"{blame}: joint 'wrist_flex' id 4: no answer",
        f"{blame}: joint 'gripper' id 6: no answer",
    ]
    assert "scan of ids" not in out and "2 problem(s)" in out


@pytest.mark.parametrize("protocol", ["dynamixel", "feetech"])
def test_a_model_the_driver_does_not_know_is_named_on_every_joint(tmp_path, capsys, protocol):
    with Emulator(protocol, model=4321).start() as emu:
        config = arm_config(tmp_path, ARMS[protocol], emu.port)
        code, _, err = probe(config, capsys)
        read_only(emu)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 6, err
    for line, name, ident in zip(lines, NAMES, range(1, 7)):
        assert line.startswith(
            f"robotd: {at(config, 'driver =')}: joints.driver: joint {name!r} id {ident}: "
            f"model 4321 is not one the {protocol} driver knows: "
        ), line
    assert ("xl330-m288 (1200)" if protocol == "dynamixel" else "sts3215 (777)") in lines[0]


def test_the_leader_arm_on_the_followers_port_is_named_by_the_models_it_answers_as(
    tmp_path, capsys
):
    with arm("dynamixel", model="xl330-m077").start() as emu:
        config = arm_config(tmp_path, "koch.toml", emu.port)
        code, _, err = probe(config, capsys)
        read_only(emu)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 6, err
    wants = ["xl430-w250"] * 2 + ["xl330-m288"] * 4
    for line, name, ident, want in zip(lines, NAMES, range(1, 7), wants, strict=True):
        assert line == (
            f"robotd: {at(config, 'models =')}: joints.options.models: joint {name!r} id "
            f"{ident}: a xl330-m077, the config wants a {want}: another arm on this port?"
        ), line


@pytest.mark.parametrize(("protocol", "judged"), [("dynamixel", 3548), ("feetech", 548)])
def test_positions_outside_the_calibrated_range_are_named_as_the_driver_will_read_them(
    tmp_path, capsys, protocol, judged
):
    with arm(protocol).start() as emu:
        config = arm_config(tmp_path, ARMS[protocol], emu.port)
        path = calibration_of(config)
        cal = load_calibration(path)
        joints = dict(cal.joints)
        # the servo holds homing offset 0 and reads 2048; the driver's open writes 1500:
        # a Dynamixel then reads 2048 + 1500, a Feetech 2048 - 1500
        joints["shoulder_pan"] = joints["shoulder_pan"].model_copy(
            update={"homing_offset": 1500, "range_min": 1000, "range_max": 3000}
        )
        joints["wrist_flex"] = joints["wrist_flex"].model_copy(
            update={"range_min": 100, "range_max": 2000}
        )
        save_calibration(cal.model_copy(update={"joints": joints}), path)
        code, _, err = probe(config, capsys)
        read_only(emu)
    blame = f"robotd: {at(config, 'calibration =')}: joints.options.calibration"
    assert (code, err.splitlines()) == (
        2,
        [
            f"{blame}: joint 'shoulder_pan' id 1: position {judged} outside the calibrated "
            "range 1000..3000",
            f"{blame}: joint 'wrist_flex' id 4: position 2048 outside the calibrated range "
            "100..2000",
        ],
    )


@pytest.mark.parametrize(
    ("protocol", "corrupt", "short", "condition"),
    [
        (
            "dynamixel",
            "CRC mismatch",
            "2 data byte(s), 3 expected",
            "hardware error: overload (Hardware Error Status 0x20)",
        ),
        ("feetech", "checksum mismatch", "1 data byte(s), 2 expected", "overload"),
    ],
)
def test_replies_that_are_not_well_formed_become_named_verdicts(
    tmp_path, capsys, protocol, corrupt, short, condition
):
    faults = ("1:checksum", "2:garbage", "3:wrong_id", "4:short", "5:error")
    with arm(protocol, faults=faults).start() as emu:
        config = arm_config(tmp_path, ARMS[protocol], emu.port)
        started = time.monotonic()
        code, out, err = probe(config, capsys, "--no-scan", "--json")
        took = time.monotonic() - started
        read_only(emu)
    verdicts = [j["verdict"] for j in report(out)["joints"]]
    assert re.fullmatch(r"garbage \(\d+ bytes, no status packet\)", verdicts[1]), verdicts
    assert verdicts[:1] + verdicts[2:] == [
        f"corrupt reply ({corrupt})",
        "a reply from id 103, not 3",
        f"a reply with {short}",
        f"the servo reports {condition}",
        "ok",
    ]
    assert code == 2 and len(err.splitlines()) == 5, err
    assert err.splitlines()[2].endswith("joints.options.ids: joint 'elbow_flex' id 3: a reply "
                                        "from id 103, not 3")  # fmt: skip
    assert "Traceback" not in err and took < 10


def test_a_port_held_by_another_process_is_said_with_its_errno(tmp_path, capsys):
    with arm("dynamixel").start() as emu:
        config = arm_config(tmp_path, "koch.toml", emu.port)
        # as the running daemon holds it: the driver's own exclusive open
        with serial.Serial(emu.port, 1_000_000, exclusive=True):
            code, out, err = probe(config, capsys, "--json")
        assert emu.received == []
    assert code == 2
    assert err == (
        f"robotd: {at(config, 'port =')}: joints.options.port: {emu.port} is held by another "
        "process (errno 11 (EAGAIN)), likely the running daemon: stop it first (systemctl "
        "stop robotd, or Ctrl-C the robotd run)\n"
    )
    assert report(out) == {"ok": False, "probed": False, "problems": [err[8:-1]]}


def test_an_absent_port_stops_the_probe_before_anything_opens(tmp_path, capsys):
    gone = tmp_path / "ttyUSB9"
    config = arm_config(tmp_path, "koch.toml", str(gone))
    code, out, err = probe(config, capsys)
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"robotd: {at(config, 'port =')}: joints.options.port: cannot open {gone}: no such "
        "device (is the adapter plugged in? `ls -l /dev/serial/by-id/` names the ones there)",
        "robotd: --probe: not probed until the config's problems are mended",
    ]
    # gone between the config check and the open: the open says it, with its errno
    with pytest.raises(TransportError) as info:
        open_bus("dynamixel", str(gone), 1_000_000)
    assert open_problem(load(config), str(gone), info.value) == (
        f"{at(config, 'port =')}: joints.options.port: cannot open {gone} (errno 2 (ENOENT): "
        "No such file or directory)"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens a device whatever its mode")
def test_a_port_not_ours_to_open_is_said_with_its_errno(tmp_path, capsys):
    with arm("feetech").start() as emu:
        config = arm_config(tmp_path, "so101.toml", emu.port)
        os.chmod(emu.port, 0)
        code, _, err = probe(config, capsys)
    assert code == 2 and "joints.options.port: cannot open " in err
    assert "(errno 13 (EACCES): Permission denied)" in err


def test_an_arm_not_yet_calibrated_is_probed_but_not_judged(tmp_path, capsys):
    with arm("feetech").start() as emu:
        config = arm_config(tmp_path, "so101.toml", emu.port, calibrated=False)
        code, out, err = probe(config, capsys, "--json")
        read_only(emu)
    assert code == 2  # robotd run would refuse it
    assert (
        err.startswith(
            f"robotd: {at(config, 'calibration =')}: joints.options.calibration: no calibration at "
        )
        and len(err.splitlines()) == 1
    ), err
    got = report(out)
    assert [(j["position"], j["range"], j["ok"]) for j in got["joints"]] == [(2048, None, True)] * 6
    assert {j["verdict"] for j in got["joints"]} == {"not calibrated: position not judged"}


def test_a_config_problem_stops_the_probe_and_its_options_need_it(tmp_path, capsys):
    with arm("feetech").start() as emu:
        config = arm_config(tmp_path, "so101.toml", emu.port)
        code, _, err = probe(config, capsys, "--set", "joints.options.ids=[1, 2, 3, 4, 5, 7]")
        assert code == 2 and err.endswith(
            "robotd: --probe: not probed until the config's problems are mended\n"
        ), err
        assert emu.received == []
        assert main(["check", "--config", str(config), "--json"]) == 2
        assert capsys.readouterr().err == "robotd: check: --no-scan and --json go with --probe\n"


def test_a_drive_mode_the_open_would_change_leaves_the_position_unjudged(tmp_path, capsys):
    with arm("dynamixel").start() as emu:
        config = arm_config(tmp_path, "koch.toml", emu.port)
        path = calibration_of(config)
        cal = load_calibration(path)
        joints = dict(cal.joints)
        # the servo is not reversed; the driver's open would reverse it: no offset rule holds
        joints["gripper"] = joints["gripper"].model_copy(update={"drive_mode": 1})
        save_calibration(cal.model_copy(update={"joints": joints}), path)
        code, out, err = probe(config, capsys, "--json")
        read_only(emu)
    assert (code, err) == (0, "")
    gripper = report(out)["joints"][-1]
    assert (gripper["present"], gripper["position"], gripper["ok"]) == (2048, None, True)
    assert gripper["verdict"] == (
        "drive mode 0 here, 1 in the calibration (the driver writes it at open): position "
        "not judged"
    )


def test_a_simulated_arm_has_no_bus_to_probe(tmp_path, capsys):
    code = main(["check", "--config", str(REPO / "config" / "sim.toml"), "--probe",
                 "--set", f'runtime.dir="{tmp_path}/run"'])  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err.endswith(
        "joints.driver: --probe reads servo arms (dynamixel, feetech), not 'sim'\n"
    )
