"""The run directory is the daemon's own: wrong owner, wide mode and symlinks are refused."""

from __future__ import annotations

import os
import stat

import pytest

from robotd.config import default_run_dir
from robotd.runtime.rundir import PID_FILE, RunDirError, lock_run_dir
from tests.daemon_util import Daemon

OTHER_UID = 65534  # nobody


def test_creates_a_0750_directory_and_holds_the_pid_file(tmp_path):
    run = tmp_path / "a" / "run"
    fd = lock_run_dir(run)
    try:
        assert stat.S_IMODE(os.lstat(run).st_mode) & ~0o750 == 0
        assert (run / PID_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(RunDirError, match=f"in use by robotd pid {os.getpid()}"):
            lock_run_dir(run)
    finally:
        os.close(fd)
    os.close(lock_run_dir(run))  # free again once the holder let go


def test_wider_mode_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o777)
    with pytest.raises(RunDirError, match="mode 0777, wider than 0750"):
        lock_run_dir(run)
    assert not (run / PID_FILE).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_other_owner_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o750)
    os.chown(run, OTHER_UID, OTHER_UID)
    with pytest.raises(RunDirError, match=f"belongs to uid {OTHER_UID}"):
        lock_run_dir(run)


def test_symlinked_directory_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o750)
    link = tmp_path / "run"
    link.symlink_to(real)
    with pytest.raises(RunDirError, match="is a symlink"):
        lock_run_dir(link)
    assert not (real / PID_FILE).exists()


def test_symlinked_pid_file_refused_and_its_target_untouched(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o750)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (run / PID_FILE).symlink_to(victim)
    with pytest.raises(RunDirError, match="a symlink"):
        lock_run_dir(run)
    assert victim.read_text() == "precious\n"


def test_hard_linked_pid_file_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o750)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.link(victim, run / PID_FILE)
    with pytest.raises(RunDirError, match="hard link"):
        lock_run_dir(run)
    assert victim.read_text() == "precious\n"


def test_default_is_the_service_dir_then_the_users_runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNTIME_DIRECTORY", "/run/robotd")
    assert str(default_run_dir()) == "/run/robotd"
    monkeypatch.delenv("RUNTIME_DIRECTORY")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_run_dir() == tmp_path / "robotd"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert str(default_run_dir()) == f"/tmp/robotd-{os.geteuid()}"


def test_daemon_refuses_a_world_writable_run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o777)
    d = Daemon(tmp_path)
    d.wait_line(r"mode 0777, wider than 0750")
    assert d.wait_exit() == 2
    assert not (run / "control.sock").exists() and not (run / "lane.sock").exists()
