"""What the trace's writer thread is given: its settings, the live view it feeds, and the
JPEG encoding of frames handed over as pixels (kept apart from the thread's loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from robotd.trace.schemas import ChannelSpec


class Sink(Protocol):
    """Something else fed the same encoded messages (the live view)."""

    def publish(self, spec: ChannelSpec, log_time_ns: int, data: bytes) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class WriterSettings:
    flush_s: float = 1.0
    flush_bytes: int = 1 << 20
    fsync: bool = True
    compression: str = "zstd"
    poll_s: float = 0.02
    max_bytes: int = 4 << 30
    episode_meta: tuple[tuple[str, Any], ...] = ()  # added to every episode's start metadata
    frame_quality: int = 85  # JPEG quality of the frames given as pixels


def jpeg(pixels: Any, quality: int = 85) -> bytes:
    """HWC uint8 RGB pixels as JPEG bytes at `quality` (ValueError when OpenCV fails)."""
    import cv2  # only a trace with frames given as pixels needs it

    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError(f"JPEG encoding of a {pixels.shape} frame failed")
    return buf.tobytes()
