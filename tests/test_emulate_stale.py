"""`--emulate` writes its calibration in a temporary directory named by the daemon's pid; a
daemon killed with SIGKILL cannot remove it, so the next `--emulate` start removes those
of dead pids (and nothing else: live pids, other users' or other names stay)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from robotd.config import load_config
from robotd.runtime.emulate import TMP_PREFIX, remove_stale_emulations, start_emulation
from tests.daemon_util import REPO


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_the_directories_of_dead_daemons_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / f"{TMP_PREFIX}{_dead_pid()}-abc123"
    alive = tmp_path / f"{TMP_PREFIX}{os.getpid()}-def456"
    for d in (dead, alive):
        d.mkdir()
        (d / "calibration.json").write_text("{}")
    a_file = tmp_path / f"{TMP_PREFIX}1-file"
    a_file.write_text("not ours to remove: not a directory")
    other = tmp_path / "robotd-emulate-x-y"  # no pid in its name
    other.mkdir()
    assert remove_stale_emulations(tmp_path) == [dead]
    assert not dead.exists() and alive.exists() and a_file.exists() and other.exists()


def test_an_emulation_names_its_directory_by_its_pid_and_removes_it_at_stop() -> None:
    overrides, stop = start_emulation(load_config(REPO / "config" / "so101.toml"))
    try:
        (calibration,) = [o.split("=", 1)[1] for o in overrides if "calibration=" in o]
        folder = Path(calibration.strip('"')).parent
        assert folder.name.startswith(f"{TMP_PREFIX}{os.getpid()}-") and folder.is_dir()
    finally:
        stop()
    assert not folder.exists()
