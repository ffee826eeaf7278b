"""The ``[trace]`` config section (light: importing it loads no MCAP code)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TraceOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # empty: $STATE_DIRECTORY/traces under systemd (StateDirectory=), else runs/ in the cwd
    dir: str = ""
    max_bytes: int = Field(4 << 30, ge=1 << 20)  # the disk budget of the whole trace.dir
    ticks: Literal["all"] | int = "all"  # "all", or every Nth tick
    # which camera frames go into the trace (docs/trace.md): "all" every frame each camera
    # captured, at its own resolution (the default: recordings are training data, and a
    # video that changes once an upload is stale against 6 rows in 7); "policy" what the
    # policy read, as it went; false none. true is "policy" (what it meant before "all"
    # existed); the validator makes it so.
    frames: Literal["policy", "all"] | Literal[False] = "all"
    frame_quality: int = Field(85, ge=1, le=100)  # of the JPEGs the writer thread encodes
    flush_s: float = Field(1.0, gt=0, le=60)
    flush_bytes: int = Field(1 << 20, ge=4096, le=256 << 20)
    fsync: bool = True  # at each flush: a power cut loses at most flush_s
    compression: Literal["zstd", "lz4", "none"] = "zstd"
    queue_records: int = Field(16384, ge=16, le=1 << 22)
    queue_bytes: int = Field(64 << 20, ge=1 << 20, le=4 << 30)

    @field_validator("ticks", mode="before")
    @classmethod
    def _ticks(cls, value: Any) -> Any:
        if value == "all" or (type(value) is int and value >= 1):
            return value
        raise ValueError(f"'all' or a whole number >= 1 (every Nth tick), got {value!r}")

    @field_validator("frames", mode="before")
    @classmethod
    def _frames(cls, value: Any) -> Any:
        # exact kinds, strict or not: a bool is a bool (no 0/1, no "true"), a mode a string
        if value is True:
            return "policy"
        if value is False or (type(value) is str and value in ("policy", "all")):
            return value
        raise ValueError(f'"policy", "all" or false (no frames), got {value!r}')

    def tick_every(self) -> int:
        return 1 if self.ticks == "all" else self.ticks


def trace_root(options: TraceOptions) -> Path:
    """Where runs go: trace.dir, else $STATE_DIRECTORY/traces (systemd), else ./runs."""
    if options.dir:
        return Path(options.dir)
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0]) / "traces"
    return Path("runs")
