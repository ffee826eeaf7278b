"""The disk budget: keep a trace root under ``trace.max_bytes``.

Oldest runs go first. A run whose lock is held (the one being written, here or by another
daemon sharing the root) is never deleted; when the budget is still exceeded after every
other run is gone, the oldest finished episodes of the current run go, never a file still
open. Each deletion is logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Collection
from pathlib import Path

from robotd.trace.rundir import episode_files, in_use, list_runs, tree_bytes

log = logging.getLogger("robotd.trace")


def enforce(
    root: Path, max_bytes: int, current: Path | None, open_files: Collection[Path] = ()
) -> list[Path]:
    """Delete until the runs under `root` hold at most `max_bytes`; the paths deleted."""
    runs = list_runs(root)
    sizes = {r.path: tree_bytes(r.path) for r in runs}
    total = sum(sizes.values())
    deleted: list[Path] = []
    for run in runs:
        if total <= max_bytes:
            return deleted
        if run.path == current or in_use(run.path):
            continue
        shutil.rmtree(run.path, ignore_errors=True)
        if not run.path.exists():
            total -= sizes[run.path]
            deleted.append(run.path)
            log.warning(
                "trace: deleted run %s (%d bytes): %s holds more than trace.max_bytes (%d)",
                run.name, sizes[run.path], root, max_bytes,
            )
    if total > max_bytes and current is not None:
        deleted += _trim_current(current, total - max_bytes, set(open_files))
    return deleted


def _trim_current(run: Path, excess: int, open_files: set[Path]) -> list[Path]:
    deleted = []
    for path in episode_files(run):
        if excess <= 0:
            break
        if path in open_files:
            continue
        sidecar = path.with_suffix(".json")
        size = 0
        for p in (path, sidecar):
            with contextlib.suppress(OSError):
                size += os.lstat(p).st_size
                os.unlink(p)
        excess -= size
        deleted.append(path)
        log.warning(
            "trace: deleted episode %s of the current run (%d bytes): no older run left to "
            "delete under trace.max_bytes", path.name, size,
        )
    return deleted
