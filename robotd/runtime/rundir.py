"""The run directory: where the daemon's sockets and pid file live, created safely.
(Where it is when the config names none: robotd.config.default_run_dir.)

Anyone who can write into the run directory can swap the control socket for their
own or point the pid file at a file of the daemon's user, so the daemon only uses a
directory that is its own: owned by its user, mode 0750 or narrower, not a symlink,
and it opens the pid file there without following a symlink. The pid file stays
locked for the daemon's life (one daemon per run directory: its sockets have fixed
names in it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import time
from pathlib import Path

from robotd.link.connect import StartupError

PID_FILE = "robotd.pid"
MAX_MODE = 0o750


log = logging.getLogger("robotd")

class RunDirError(StartupError):
    """The run directory cannot be used safely (or is in use); the message says why."""


def _check_dir(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirError(f"run directory {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise RunDirError(
            f"run directory {path} belongs to uid {st.st_uid}, not to this daemon's uid "
            f"{os.geteuid()}: someone else made it; remove it or choose another runtime.dir"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & ~MAX_MODE:
        raise RunDirError(
            f"run directory {path} has mode {mode:04o}, wider than {MAX_MODE:04o}: others "
            f"could replace its sockets; chmod {MAX_MODE:04o} {path}"
        )


def _open_dir(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, MAX_MODE)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if isinstance(exc, FileExistsError):  # a file where a directory must be
            why = "not a directory"
        if exc.filename and str(exc.filename) != str(path):
            why = f"{exc.filename}: {why}"
        raise RunDirError(
            f"runtime.dir {path}: cannot create it: {why}; choose a directory the daemon's "
            "user may create"
        ) from None
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise RunDirError(f"run directory {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise RunDirError(f"run directory {path} is a symlink: it is not followed")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise RunDirError(f"run directory {path}: {exc.strerror}") from None
    try:
        # fstat the directory we opened (not the name, which could have been swapped since)
        _check_dir(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_run_dir(path: Path) -> None:
    """What lock_run_dir would refuse, found without creating anything (`robotd check`):
    RunDirError when `path` exists and is not a directory of ours with a narrow mode, or
    does not exist and its nearest existing ancestor is not a directory we may write."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise RunDirError(f"runtime.dir {path}: {exc.strerror}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise RunDirError(f"run directory {path} is a symlink: it is not followed")
        _check_dir(path, st)
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK) or _holds_nothing(parent):
        raise RunDirError(
            f"runtime.dir {path}: cannot create it: {parent} is not a directory this user "
            "may write; choose a directory the daemon's user may create"
        )


def _holds_nothing(directory: Path) -> bool:
    """A read-only filesystem, or one without blocks (/proc, /sys): nothing is made there."""
    try:
        fs = os.statvfs(directory)
    except OSError:
        return False
    return bool(fs.f_flag & os.ST_RDONLY) or fs.f_blocks == 0


def _open_pid_file(path: Path, dir_fd: int) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(PID_FILE, flags, 0o640, dir_fd=dir_fd)
    except OSError as exc:
        why = "a symlink (not followed)" if exc.errno == errno.ELOOP else exc.strerror
        raise RunDirError(f"pid file {path / PID_FILE}: {why}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise RunDirError(
            f"pid file {path / PID_FILE} is not a plain file of this daemon's own "
            "(another owner, a device or a hard link): remove it"
        )
    return fd


def lock_run_dir(path: Path, orphan_wait_s: float = 0.0) -> int:
    """Create (mode 0750) or check the run directory, then hold its pid file locked.

    The daemon's control lane holds the lock too (it inherits the descriptor), so a lane
    left holding the robot after its main process died keeps the directory: its lane.sock
    still takes e-stops, and no second lane opens the same bus. Such a lane (the pid file's
    daemon is gone) is waited for, up to `orphan_wait_s` (it exits within that).

    Refused with RunDirError: a symlink, a directory of another owner or with a mode
    wider than 0750, a pid file that is a symlink or not a plain file of ours, or a
    directory in use by another daemon (or by an orphaned lane past `orphan_wait_s`).
    Returns the pid file's descriptor (keep it open: the lock lasts as long as it does).
    """
    dir_fd = _open_dir(path)
    try:
        fd = _open_pid_file(path, dir_fd)
    finally:
        os.close(dir_fd)
    try:
        _lock(fd, path, orphan_wait_s)
    except RunDirError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _lock(fd: int, path: Path, orphan_wait_s: float) -> None:
    """Take the pid file's lock, waiting for an orphaned control lane (its daemon gone)."""
    deadline, said = time.monotonic() + orphan_wait_s, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        holder = int(text) if text.isdigit() else None
        if holder is not None and pid_alive(holder):
            raise RunDirError(
                f"runtime.dir {path} is in use by robotd pid {holder} (lock "
                f"{path / PID_FILE}); give each daemon its own runtime.dir"
            )
        if time.monotonic() >= deadline:
            raise RunDirError(
                f"runtime.dir {path} is held by the control lane of robotd pid "
                f"{text or '?'}, which is gone: the lane holds the robot, then applies its "
                f"e-stop category and exits, and it has not let go within {orphan_wait_s:g} "
                "s (an e-stop reaches it on lane.sock)"
            )
        if not said:
            said = True
            log.warning(
                "runtime.dir %s: the control lane of robotd pid %s, which is gone, still "
                "holds the robot: waiting up to %g s for it to stop and exit",
                path, text or "?", orphan_wait_s,
            )
        time.sleep(0.1)  # polled: flock has no timeout, and the wait is for another process


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def lock_holder(path: Path) -> int | None:
    """The pid of the daemon holding run directory `path` (its pid file's lock), read from
    /proc/locks: never taking the lock, so a daemon starting that instant is not refused.
    None when nobody holds it, or it cannot be told (no such file, another system)."""
    try:
        st = os.stat(path / PID_FILE, follow_symlinks=False)
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF" (a waiter's line has "->" second)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        f = line.split()
        if len(f) >= 6 and f[1] == "FLOCK" and f[5] == inode and f[4].isdigit():
            return int(f[4])
    return None


_disowned = False  # the run directory is no longer this daemon's (lost or replaced)


def disown_run_dir() -> None:
    """The run directory was removed or replaced under this daemon: its socket files now may
    be another daemon's (same names), so none is removed at the end."""
    global _disowned
    _disowned = True


def remove_socket_file(path: Path) -> None:
    """Remove a socket file this run made, at its end. A directory that refuses (remounted
    read-only) leaves it behind, said rather than raised: the rest of the shutdown goes on
    (a later start binds over a stale socket file). Nothing is removed once the directory
    is disowned (disown_run_dir)."""
    if _disowned:
        log.info("%s left as it is: the run directory is no longer this daemon's", path)
        return
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot remove %s: %s: left behind", path, exc.strerror or exc)
