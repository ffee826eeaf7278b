"""What the writer thread keeps about each open file: the MCAP file, its sidecar, counts."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robotd.trace.mcapfile import McapFile
from robotd.trace.rundir import is_disk_full, write_json_atomic


def iso_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def refusal(name: str, exc: OSError) -> dict[str, Any]:
    """Why file `name` takes no records (status says it while it lasts)."""
    return {"file": name, "error": str(exc), "disk_full": is_disk_full(exc), "at": iso_now()}


@dataclass
class OpenFile:
    """One MCAP file being written (an episode's, or the run's session file)."""

    file: McapFile
    episode: int | None  # None: the session file
    sidecar: Path | None
    info: dict[str, Any] = field(default_factory=dict)
    broken: bool = False
    last_flush: float = field(default_factory=time.monotonic)
    ticks: int = 0
    frames: int = 0
    first_tick_ns: int | None = None
    last_tick_ns: int | None = None
    worker_episodes: list[str] = field(default_factory=list)
    # what reached the disk: the counts as of the last flush that succeeded
    seen: int = 0  # messages handed to this file, written or not
    kept: tuple[int, int, int, int | None] = (0, 0, 0, None)  # ticks, frames, seen, last tick
    stopped: dict[str, Any] | None = None  # why and when writing stopped (a write error)

    def saw_tick(self, log_time_ns: int, record: Any) -> None:
        self.ticks += 1
        if self.first_tick_ns is None:
            self.first_tick_ns = log_time_ns
        self.last_tick_ns = log_time_ns
        wep = record.get("wep") if isinstance(record, dict) else getattr(record, "wep", None)
        seen = self.worker_episodes
        # the common case (same worker-side episode as the last tick) costs one compare
        new = wep is not None and (not seen or seen[-1] != str(wep)) and len(seen) < 1000
        if new and str(wep) not in seen:
            seen.append(str(wep))

    def flushed(self) -> None:
        """Everything handed to the file so far is on disk."""
        self.kept = (self.ticks, self.frames, self.seen, self.last_tick_ns)

    def stop(self, exc: OSError) -> None:
        """Writing stopped for good (the file was abandoned after `exc`)."""
        self.broken = True
        self.stopped = {"error": str(exc), "disk_full": is_disk_full(exc), "at": iso_now()}

    def _span(self, last: int | None) -> float:
        if self.first_tick_ns is None or last is None:
            return 0.0
        return round((last - self.first_tick_ns) / 1e9, 6)

    def summary(self) -> dict[str, Any]:
        """The sidecar's counts: the episode's ticks and span (all it had, recorded or
        not), and for a file a write error closed, ``recording_stopped``: why, when, and
        how much of it is on disk (up to its last good flush) and how much was lost."""
        out: dict[str, Any] = {
            "ticks": self.ticks,
            "frames": self.frames,
            "messages": self.file.messages,
            "duration_s": self._span(self.last_tick_ns),
            "worker_episodes": list(self.worker_episodes),
        }
        if self.stopped is not None:
            ticks, frames, seen, last = self.kept
            out["recording_stopped"] = {
                **self.stopped, "recorded_ticks": ticks, "recorded_s": self._span(last),
                "lost_ticks": self.ticks - ticks, "lost_frames": self.frames - frames,
                "lost_messages": self.seen - seen,
            }
        return out

    def write_sidecar(self) -> None:
        if self.sidecar is not None:
            write_json_atomic(self.sidecar, {**self.info, **self.summary()})
