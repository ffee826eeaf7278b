"""The run directory: one daemon per directory, since its sockets have fixed names there."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from robotd.link.connect import StartupError


def lock_run_dir(run_dir: Path) -> int:
    """Create `run_dir` (0750) and hold `run_dir/robotd.pid` locked for the daemon's life:
    one daemon per run directory (control.sock and lane.sock have fixed names there)."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
    path = run_dir / "robotd.pid"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StartupError(
            f"runtime.dir {run_dir} is in use by robotd pid {holder} (lock {path}); "
            "give each daemon its own runtime.dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
