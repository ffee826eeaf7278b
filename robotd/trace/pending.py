"""JSON files of a run (episode sidecars) that a write error kept off the disk.

A full disk must not cost an episode its end: the writer thread hands every sidecar write
to `PendingJson`, which writes it at once and, when that fails, keeps the newest data for
the path and tries again (`retry`, at most once a `RETRY_S`) until it lands.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from robotd.trace.rundir import write_json_atomic

RETRY_S = 1.0  # a full disk is not asked again more often than this


class PendingJson:
    def __init__(self) -> None:
        self.files: dict[Path, dict[str, Any]] = {}
        self._tried = 0.0

    def write(self, path: Path, data: dict[str, Any]) -> OSError | None:
        """Write `data` to `path` now; on failure keep it for `retry` and return the error."""
        self.files.pop(path, None)
        try:
            write_json_atomic(path, data)
        except OSError as exc:
            self.files[path] = data
            return exc
        return None

    def retry(self, force: bool = False) -> list[Path]:
        """Write the pending files again (unless `force`, at most once a RETRY_S); the
        paths written. The first that still fails ends the round: the disk is still full."""
        now = time.monotonic()
        if not self.files or (not force and now - self._tried < RETRY_S):
            return []
        self._tried = now
        done = []
        for path, data in list(self.files.items()):
            try:
                write_json_atomic(path, data)
            except OSError:
                break
            del self.files[path]
            done.append(path)
        return done
