"""Run directories: one per daemon start, named so that names sort by start time.

A run directory holds ``run.json`` (config snapshot, versions, host, start and end time),
``.lock`` (held by the daemon writing it, so the disk budget knows it is in use), one
``episode-NNNNNN.mcap`` per operator-level episode with its ``episode-NNNNNN.json``
sidecar (outcome, verdict, length), and ``session.mcap`` for what happens between
episodes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import platform
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_JSON = "run.json"
LOCK = ".lock"
SESSION = "session.mcap"
# a few blocks set aside at the run's start and given up when a full disk refuses a
# sidecar or run.json, so that an episode's end and the run's still get written
RESERVE = ".reserve"
RESERVE_BYTES = 64 << 10
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_RUN_NAME = re.compile(r"^\d{8}T\d{6}\.\d{6}Z-\d+(-\d+)?$")
_EPISODE_NAME = re.compile(r"^episode-(\d{6,})(-\d+)?\.mcap$")
MAX_JSON_BYTES = 16 << 20  # a run.json or sidecar larger than this is not ours


def robotd_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("robotd")
    except PackageNotFoundError:
        return "unknown"


def run_name(now: dt.datetime, pid: int) -> str:
    """``20261101T120304.123456Z-4242``: UTC start time, then the pid."""
    return now.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ") + f"-{pid}"


def is_run_name(name: str) -> bool:
    return bool(_RUN_NAME.match(name))


def episode_name(episode: int, attempt: int = 0) -> str:
    return f"episode-{episode:06d}" + (f"-{attempt}" if attempt else "")


def is_episode_file(name: str) -> bool:
    return bool(_EPISODE_NAME.match(name))


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON beside `path` and rename it into place: a reader sees all or nothing.

    A failed write leaves no temporary behind. When the disk is full and the run directory
    holds its `RESERVE`, the reserve is given up and the write tried once more."""
    try:
        _write_json(path, data)
    except OSError as exc:
        reserve = path.parent / RESERVE
        if exc.errno not in DISK_FULL or not reserve.is_file():
            raise
        reserve.unlink(missing_ok=True)
        _write_json(path, data)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # never a .tmp left behind (a full disk's, say)
            os.unlink(tmp)
        raise


def make_reserve(run_dir: Path) -> bool:
    """Set `RESERVE_BYTES` aside in `run_dir` (best effort: False when there is no room)."""
    path = run_dir / RESERVE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    except OSError:
        return False
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return False
    finally:
        os.close(fd)


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file of ours, or None when missing, oversized or not an object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def make_root(root: Path) -> None:
    """Create the trace root (mode 0750); a file in its place is refused."""
    root.mkdir(mode=0o750, parents=True, exist_ok=True)
    if not root.is_dir():
        raise NotADirectoryError(f"trace.dir {root}: not a directory")


def make_run_dir(root: Path, now: dt.datetime | None = None) -> Path:
    """A new run directory under `root` (never an existing one)."""
    make_root(root)
    base = run_name(now or dt.datetime.now(dt.UTC), os.getpid())
    for attempt in range(1000):
        path = root / (base if attempt == 0 else f"{base}-{attempt}")
        try:
            path.mkdir(mode=0o750)
        except FileExistsError:
            continue
        return path
    raise OSError(f"trace.dir {root}: cannot make a run directory named {base}")


def run_info(config_snapshot: dict[str, Any], started: dt.datetime) -> dict[str, Any]:
    return {
        "robotd": robotd_version(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": started.astimezone(dt.UTC).isoformat(),
        "ended": None,
        "config": config_snapshot,
    }


class RunLock:
    """An exclusive flock on ``<run>/.lock`` for the life of the writer."""

    def __init__(self, run_dir: Path) -> None:
        fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def in_use(run_dir: Path) -> bool:
    """Whether a live writer holds this run's lock."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


@dataclass(frozen=True)
class RunEntry:
    path: Path
    info: dict[str, Any]  # run.json, {} when unreadable

    @property
    def name(self) -> str:
        return self.path.name


def list_runs(root: Path) -> list[RunEntry]:
    """The run directories under `root`, oldest first (symlinks and strangers ignored)."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for name in names:
        path = root / name
        if is_run_name(name) and path.is_dir() and not path.is_symlink():
            out.append(RunEntry(path, read_json(path / RUN_JSON) or {}))
    return out


def episode_files(run_dir: Path) -> list[Path]:
    """The run's episode MCAP files, in episode order."""
    with contextlib.suppress(OSError):
        names = sorted(n for n in os.listdir(run_dir) if is_episode_file(n))
        return [run_dir / n for n in names if not (run_dir / n).is_symlink()]
    return []


def tree_bytes(path: Path) -> int:
    """The bytes of the files under `path` (their sizes), symlinks not followed. A live
    run's `RESERVE` is not counted: it is room held for the run's own ends, not recording,
    and gone when the run closes (counted, the budget would delete recordings for it)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            if name == RESERVE:
                continue
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total
