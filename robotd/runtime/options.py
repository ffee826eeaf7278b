"""What `robotd run` was asked, besides the config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Options:
    duration: float | None = None
    summary: Path | None = None
    worker: str | None = None
    status: bool = True
    config_dir: Path | None = None  # where the config file is (calibration files beside it)
    foxglove: int | None = None  # serve the trace's channels live on this port
    foxglove_host: str = "127.0.0.1"
