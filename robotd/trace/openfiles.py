"""The trace writer's open files on disk, and what keeps them healthy.

The writer thread (robotd.trace.writer) decides what goes into which file; this class holds
the files themselves and their care: the open episode files and the run's session file,
opening each under a free name, reopening the session (session-N.mcap) after a write
error closed it, flushing, closing a file a write error broke (and saying so in its
sidecar), sidecars a full disk holds back, and the run directory's disk budget. It never
writes a record itself, so it needs nothing of the writer but a way to complain.
It runs on the writer thread only; the store reads `files`, `refused`, `stopped` and
`deleted` from the event loop as plain attributes (robotd.trace.store.health).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robotd.trace import budget
from robotd.trace.episodes import OpenFile, refusal
from robotd.trace.mcapfile import McapFile
from robotd.trace.pending import RETRY_S, PendingJson
from robotd.trace.rundir import SESSION, make_reserve
from robotd.trace.sink import WriterSettings

log = logging.getLogger("robotd.trace")

# The writer's complaint (key, text): counted, logged the first time and every 1000th a key.
Complain = Callable[[str, str], None]


class OpenFiles:
    """The files the writer thread has open, and their flushing, failures and budget."""

    def __init__(self, run_dir: Path | None, settings: WriterSettings, complain: Complain) -> None:
        self.run_dir, self.settings, self._complain = run_dir, settings, complain
        self.files: dict[int, OpenFile] = {}  # episode writer key -> open episode file
        self.session: OpenFile | None = None
        self.pending = PendingJson()  # sidecars a write error held back, retried
        self.stopped: list[dict[str, Any]] = []  # files a write error closed: run.json's
        self.refused: dict[str, Any] | None = None  # why nothing is written now (status)
        self._session_tried = 0.0  # when a session file was last tried (after a failure)
        self.deleted = 0  # files the disk budget deleted
        self.since_budget = 0  # bytes written since the budget was last kept

    def open_mcap(self, stem: str, meta: dict[str, Any]) -> McapFile:
        assert self.run_dir is not None
        for attempt in range(1000):
            path = self.run_dir / (episode_name_attempt(stem, attempt) + ".mcap")
            try:
                return McapFile(
                    path, meta, compression=self.settings.compression, fsync=self.settings.fsync
                )
            except FileExistsError:
                continue
        raise FileExistsError(f"{self.run_dir}: no free name for {stem}")

    def session_file(self) -> OpenFile | None:
        """The session file, opened on first use; after a write error closed it, a new one
        (session-N.mcap: an MCAP file cannot be appended to) once a file opens again, tried
        at most once a RETRY_S."""
        s = self.session
        if self.run_dir is None or (s is not None and not s.broken):
            return s
        now = time.monotonic()
        if s is not None and now - self._session_tried < RETRY_S:
            return None
        self._session_tried = now
        try:
            mf = self.open_mcap(SESSION.removesuffix(".mcap"), {"run": self.run_dir.name})
        except OSError as exc:
            self.refused = refusal(SESSION, exc)
            if s is None:
                self._complain("session", f"trace: cannot open {SESSION}: {exc}")
            return None
        self.refused = None
        if s is not None:
            log.warning("trace: writing again: the session continues in %s (%s was closed "
                        "by a write error)", mf.path.name, s.file.path.name)
            make_reserve(self.run_dir)  # room again: set the reserve aside again
        self.session = OpenFile(mf, None, None)
        return self.session

    def close(self, f: OpenFile, end: dict[str, Any]) -> None:
        """Finish `f` (unless a write error closed it already) and write its sidecar: an
        episode's end gets there either way."""
        if not f.broken:
            try:
                f.file.finish(end)
                f.flushed()
            except OSError as exc:
                self.broken(f, exc)
        self.sidecar(f)

    def sidecar(self, f: OpenFile) -> None:
        """Write `f`'s sidecar now, or (a full disk) as soon as the disk takes it."""
        if f.sidecar is None:
            return
        if exc := self.pending.write(f.sidecar, {**f.info, **f.summary()}):
            self._complain(f"sidecar:{f.sidecar}",
                           f"trace: {f.sidecar}: {exc}; written once the disk takes it")

    def broken(self, f: OpenFile, exc: OSError) -> None:
        if not f.broken:
            f.stop(exc)
            f.file.abandon()
            self.stopped.append({"file": f.file.path.name, **(f.stopped or {})})
            self.refused = self.stopped[-1]
            self._complain(f"broken:{f.file.path}", f"trace: {f.file.path}: {exc}; file closed")
            self.sidecar(f)  # says so at once, should the daemon not live to the end

    def writable(self) -> list[OpenFile]:
        """The open files no write error has closed: episodes', then the session's."""
        out = [f for f in self.files.values() if not f.broken]
        if self.session is not None and not self.session.broken:
            out.append(self.session)
        return out

    def flush(self, f: OpenFile) -> None:
        try:
            f.file.flush()
            f.flushed()
        except OSError as exc:
            self.broken(f, exc)
        f.last_flush = time.monotonic()

    def flush_due(self) -> None:
        """Once a drain: flush what waited flush_s, keep the budget every max_bytes/16
        written (1 MiB at least), and retry the sidecars a full disk held back."""
        now = time.monotonic()
        for f in self.writable():
            if f.file.unflushed and now - f.last_flush >= self.settings.flush_s:
                self.flush(f)
        if self.since_budget >= max(1 << 20, self.settings.max_bytes // 16):
            self.budget()
        for path in self.pending.retry():
            log.warning("trace: %s written at last (a write error had held it back)", path.name)

    def budget(self) -> None:
        self.since_budget = 0
        if self.run_dir is None:
            return
        try:
            open_paths = [f.file.path for f in self.writable()]
            gone = budget.enforce(self.run_dir.parent, self.settings.max_bytes, self.run_dir,
                                  open_paths)
            self.deleted += len(gone)
        except OSError as exc:
            self._complain("budget", f"trace: disk budget: {exc}")

    def close_session(self) -> None:
        """At the writer's end, after every episode file closed: the session file closed,
        and each held-back sidecar tried once more (an error logged for each that fails)."""
        if self.session is not None:
            self.close(self.session, {"outcome": None})
        self.pending.retry(force=True)
        for path in self.pending.files:
            log.error("trace: %s could not be written (the disk still refuses it)", path)


def episode_name_attempt(stem: str, attempt: int) -> str:
    return stem if attempt == 0 else f"{stem}-{attempt}"
