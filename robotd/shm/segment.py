"""Shared-memory segments: plain /dev/shm files mapped with mmap, owned by their creator.

Why not multiprocessing.shared_memory: on Python 3.11 its resource_tracker unlinks a
segment when a child that merely attached to it exits. Here the process that creates a
segment owns it and is the only one that unlinks it (and a run's main process unlinks
everything under its prefix at exit, whatever its children made).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import tempfile
from pathlib import Path

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
_ALIGN = 64



class ShmError(Exception):
    """A shared-memory segment is missing, already exists, is corrupt, or was closed."""


def round_up(n: int, align: int = _ALIGN) -> int:
    """n rounded up to a multiple of align."""
    return (n + align - 1) // align * align


def shm_path(name: str) -> Path:
    """The file backing segment `name`; ValueError for a name that is not a plain file name."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"shared memory name {name!r} is invalid: use 1-200 characters of "
            "letters, digits, '.', '_', '-' (no '/'), not starting with '.' or '-'"
        )
    return SHM_DIR / name


def create_segment(name: str, size: int) -> mmap.mmap:
    """Create the file for segment `name` (exclusive) with `size` bytes reserved and map it.

    The pages are reserved up front (posix_fallocate) so that a full /dev/shm is a
    clear ShmError now rather than a SIGBUS on first write.
    """
    path = shm_path(name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ShmError(
            f"shared memory {name!r} already exists ({path}); a previous run may have "
            "crashed: remove it (robotd.shm.unlink_prefix) and retry"
        ) from None
    except OSError as exc:
        raise ShmError(f"cannot create shared memory {name!r} ({path}): {exc}") from exc
    try:
        _reserve(fd, size, name)
        return mmap.mmap(fd, size)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)


def _reserve(fd: int, size: int, name: str) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except AttributeError:  # not on this platform
        os.ftruncate(fd, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            os.ftruncate(fd, size)
        else:
            raise ShmError(f"cannot reserve {size} bytes of shared memory {name!r}: {exc}") from exc


def attach_segment(name: str, length: int | None = None) -> tuple[mmap.mmap, int]:
    """Map the existing segment `name` read-write: its first `length` bytes (default: all).
    Returns (mapping, the segment's full size); ShmError if absent, empty or too short."""
    path = shm_path(name)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise ShmError(f"shared memory {name!r} does not exist ({path})") from None
    except OSError as exc:
        raise ShmError(f"cannot open shared memory {name!r} ({path}): {exc}") from exc
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise ShmError(f"shared memory {name!r} is empty ({path}): not a robotd segment")
        if length is not None and length > size:
            raise ShmError(f"shared memory {name!r} has {size} bytes, need {length}")
        return mmap.mmap(fd, size if length is None else length), size
    finally:
        os.close(fd)


def release_mmap(mm: mmap.mmap) -> bool:
    """Unmap now if nothing still views the mapping; else leave it to the last view's collection.

    Returns True if unmapped now. Never unmaps under a live numpy view (which would
    make touching that view crash the process).
    """
    try:
        mm.close()
    except BufferError:
        return False
    return True


def unlink_segment(name: str) -> bool:
    """Remove segment `name`'s file; True if it existed. Mappings stay valid until unmapped."""
    try:
        os.unlink(shm_path(name))
    except FileNotFoundError:
        return False
    return True


def unlink_prefix(prefix: str) -> list[str]:
    """Remove every leftover segment whose name starts with `prefix`; return their names.

    Used at start-up to clean up after a crashed run. The prefix must be a valid,
    non-empty name so that a mistake cannot empty /dev/shm.
    """
    shm_path(prefix)  # validates
    removed = []
    for entry in sorted(SHM_DIR.iterdir()):
        if entry.name.startswith(prefix) and unlink_segment(entry.name):
            removed.append(entry.name)
    return removed


