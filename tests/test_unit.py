"""The systemd unit, users and directories pass systemd's own tools, and the unit's
exposure stays low (systemd-analyze security)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from robotd.runtime.unit import render_unit
from tests.daemon_util import REPO

SYSTEMD = REPO / "systemd"
MAX_EXPOSURE = 3.0
needs_systemd = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (.ci/run installs Debian's systemd package)",
)


def _unit_here(tmp_path: Path) -> Path:
    # This checkout's environment, so that ExecStart names a program that exists.
    unit = tmp_path / "robotd.service"
    unit.write_text(render_unit())
    return unit


def test_the_shipped_unit_is_the_rendered_one():
    assert (SYSTEMD / "robotd.service").read_text() == render_unit(Path("/opt/robotd"))


def _robotd_unit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "robotd", "unit", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_robotd_unit_prints_it_for_a_prefix(tmp_path):
    # Not installed there (yet): said so unless --allow-missing (test below).
    out = _robotd_unit("--prefix", "/srv/robot env", "--allow-missing")
    assert out.returncode == 0, out.stderr
    assert 'ExecStart="/srv/robot env/bin/robotd" run --config /etc/robotd/robot.toml' in out.stdout
    assert "ProtectHome=yes" in out.stdout
    home = render_unit(Path("/home/op/robotd"))
    assert "ProtectHome=read-only" in home and "/home/op/robotd/bin/robotd run" in home


def _robotd_at(prefix: Path, mode: int) -> Path:
    robotd = prefix / "bin" / "robotd"
    robotd.parent.mkdir(parents=True)
    robotd.write_text("#!/bin/sh\n")
    robotd.chmod(mode)
    return robotd


def test_robotd_unit_refuses_a_program_that_is_not_there_or_not_executable(tmp_path):
    for prefix, why in (
        (tmp_path / "nowhere", "does not exist"),
        (_robotd_at(tmp_path / "plain", 0o644).parents[1], "is not executable"),
    ):
        out = _robotd_unit("--prefix", str(prefix))
        assert out.returncode == 2 and out.stdout == "", out
        assert out.stderr.startswith(f"robotd unit: ExecStart: {prefix}/bin/robotd {why}")
        assert "no unit written" in out.stderr and "--allow-missing" in out.stderr
        allowed = _robotd_unit("--prefix", str(prefix), "--allow-missing")
        assert allowed.returncode == 0 and f"ExecStart={prefix}/bin/robotd run" in allowed.stdout
    there = _robotd_at(tmp_path / "installed", 0o755)
    out = _robotd_unit("--prefix", str(there.parents[1]))
    assert out.returncode == 0 and out.stderr == "" and f"ExecStart={there} run" in out.stdout
    if (Path(sys.prefix) / "bin" / "robotd").exists():  # the environment running it
        here = _robotd_unit()
        assert here.returncode == 0 and here.stderr == "", here.stderr


@needs_systemd
def test_unit_verifies_with_no_word_from_systemd(tmp_path):
    unit = _unit_here(tmp_path)
    out = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr


@needs_systemd
def test_unit_exposure_is_low(tmp_path):
    unit = _unit_here(tmp_path)
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for robotd\.service: ([0-9.]+)", out.stdout)
    assert found, out.stdout + out.stderr
    assert float(found.group(1)) <= MAX_EXPOSURE, out.stdout


@needs_systemd
def test_unit_keeps_what_the_robot_needs():
    text = render_unit(Path("/opt/robotd"))
    for line in (
        "CapabilityBoundingSet=CAP_SYS_NICE CAP_IPC_LOCK",
        "AmbientCapabilities=CAP_SYS_NICE CAP_IPC_LOCK",
        "DeviceAllow=char-ttyUSB rw",
        "DeviceAllow=char-ttyACM rw",
        "DeviceAllow=char-video4linux rw",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "StateDirectory=robotd",
        "RuntimeDirectoryMode=0750",
    ):
        assert line in text.splitlines()
    # realtime scheduling and mlock stay possible: never restricted
    assert "RestrictRealtime=yes" not in text and "PrivateDevices=yes" not in text
    allowed, privileged = _syscalls("@system-service"), _syscalls("@privileged")
    for call in ("sched_setscheduler", "mlockall", "mmap", "socket", "ioctl", "clock_nanosleep"):
        assert call in allowed and call not in privileged, call


def _syscalls(group: str, seen: set[str] | None = None) -> set[str]:
    """The system calls of a systemd filter group, its nested groups expanded."""
    seen = set() if seen is None else seen
    seen.add(group)
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter", group], capture_output=True, text=True, timeout=60
    ).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        word = line.strip()
        if not word or word.startswith("#"):
            continue
        if word.startswith("@"):
            if word not in seen:
                calls |= _syscalls(word, seen)
        else:
            calls.add(word)
    return calls


@pytest.mark.skipif(
    shutil.which("systemd-sysusers") is None or shutil.which("systemd-tmpfiles") is None,
    reason="systemd-sysusers/systemd-tmpfiles are not installed",
)
def test_sysusers_and_tmpfiles_make_the_user_and_directories(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    for name in ("passwd", "group"):
        shutil.copy(f"/etc/{name}", root / "etc" / name)
    for kind, src in (
        ("sysusers.d", "robotd.sysusers.conf"),
        ("tmpfiles.d", "robotd.tmpfiles.conf"),
    ):
        (root / "usr/lib" / kind).mkdir(parents=True)
        shutil.copy(SYSTEMD / src, root / "usr/lib" / kind / "robotd.conf")
    for tool in (["systemd-sysusers"], ["systemd-tmpfiles", "--create"]):
        out = subprocess.run(
            [*tool, f"--root={root}", "robotd.conf"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
    passwd = (root / "etc/passwd").read_text()
    assert re.search(r"^robotd:x:\d+:\d+:", passwd, re.M)
    groups = (root / "etc/group").read_text()
    assert re.search(r"^dialout:.*robotd", groups, re.M)
    assert re.search(r"^video:.*robotd", groups, re.M)
    state = root / "var/lib/robotd"
    assert state.is_dir() and oct(state.stat().st_mode & 0o777) == "0o750"
    assert (root / "etc/robotd/curve/clients").is_dir()


def test_udev_rule_sets_the_ftdi_latency_timer_to_1_ms():
    rules = [
        line
        for line in (SYSTEMD / "99-robotd-ftdi.rules").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules == [
        'ACTION=="add", SUBSYSTEM=="usb-serial", DRIVERS=="ftdi_sio", ATTR{latency_timer}="1"'
    ]
