"""What the writer thread keeps about each open file: the MCAP file, its sidecar, counts."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robotd.trace.mcapfile import McapFile
from robotd.trace.rundir import write_json_atomic


def iso_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


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

    def summary(self) -> dict[str, Any]:
        span = 0.0
        if self.first_tick_ns is not None and self.last_tick_ns is not None:
            span = (self.last_tick_ns - self.first_tick_ns) / 1e9
        return {
            "ticks": self.ticks,
            "frames": self.frames,
            "messages": self.file.messages,
            "duration_s": round(span, 6),
            "worker_episodes": list(self.worker_episodes),
        }

    def write_sidecar(self) -> None:
        if self.sidecar is not None:
            write_json_atomic(self.sidecar, {**self.info, **self.summary()})
