"""Where an OpenCV camera's frames come from: a device (index or /dev/video path), a
video file, a stream URL, or a test pattern; what was asked of it and what it granted."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

BACKENDS = {"any": cv2.CAP_ANY, "v4l2": cv2.CAP_V4L2, "ffmpeg": cv2.CAP_FFMPEG}


def kind_of(source: int | str) -> str:
    """'device' (index, /dev/...), 'stream' (a URL) or 'file'."""
    if isinstance(source, int) or str(source).startswith("/dev/"):
        return "device"
    return "stream" if "://" in str(source) else "file"


def fourcc_text(code: float) -> str:
    value = int(code)
    text = "".join(chr((value >> (8 * i)) & 0xFF) for i in range(4))
    return text if text.isprintable() and text.strip() else f"{value:#x}"


@dataclass(frozen=True)
class Granted:
    """What a source delivers (0 / '' where it does not say)."""

    width: int
    height: int
    fps: float
    fourcc: str


class CaptureSource:
    """A cv2.VideoCapture: opened, asked for size/rate/FOURCC (devices only), and read."""

    def __init__(self, source: int | str, backend: str) -> None:
        self.source = source
        self.kind = kind_of(source)
        self._backend = BACKENDS[backend]
        self.cap: cv2.VideoCapture | None = None

    def exists(self) -> str | None:
        """None unless a file or a device path names nothing: then "no such ..."."""
        if self.kind == "file" and not Path(str(self.source)).is_file():
            return "no such file"
        if (
            self.kind == "device"
            and isinstance(self.source, str)
            and not Path(self.source).exists()
        ):
            return "no such device"
        return None

    def open(self, width: int, height: int, fps: float, fourcc: str | None) -> str | None:
        """Open; None when it delivers frames, else why not."""
        why = self.exists()
        if why is not None:
            return why
        said: list[str] = []
        with captured_stderr(said, self.kind != "device"):
            cap = cv2.VideoCapture(self.source, self._backend)
        if not cap.isOpened():
            cap.release()
            return "cannot be opened" + (f" ({said[0]})" if said else "")
        if self.kind == "device":
            if fourcc:
                cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*fourcc))
            cap.set(cv2.CAP_PROP_FRAME_WIDTH, width)
            cap.set(cv2.CAP_PROP_FRAME_HEIGHT, height)
            cap.set(cv2.CAP_PROP_FPS, fps)
            cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)  # the newest frame, not a queue of old ones
        self.cap = cap
        return None

    def granted(self) -> Granted:
        cap = self.cap
        if cap is None:
            return Granted(0, 0, 0.0, "")
        return Granted(
            int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)),
            int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
            float(cap.get(cv2.CAP_PROP_FPS) or 0.0),
            fourcc_text(cap.get(cv2.CAP_PROP_FOURCC)),
        )

    def grab(self) -> bool:
        return self.cap is not None and bool(self.cap.grab())

    def retrieve(self) -> np.ndarray | None:
        if self.cap is None:
            return None
        ok, frame = self.cap.retrieve()
        return frame if ok else None

    def rewind(self) -> bool:
        return self.cap is not None and bool(self.cap.set(cv2.CAP_PROP_POS_FRAMES, 0))

    def release(self) -> None:
        cap, self.cap = self.cap, None
        if cap is not None:
            cap.release()

    def describe(self) -> str:
        return f"{self.kind} {self.source}"


# FFmpeg's own prefix on what it prints: "[mov,mp4,m4a,3gp,3g2,mj2 @ 0x55d0c8e0] "
_AV_PREFIX = re.compile(r"^\[[^\]]* @ 0x[0-9a-f]+\]\s*")


@contextlib.contextmanager
def captured_stderr(said: list[str], enabled: bool = True) -> Iterator[None]:
    """What the C libraries (FFmpeg) print on file descriptor 2 meanwhile, taken into
    `said` (its distinct lines, FFmpeg's prefix cut) instead of the process's stderr: a
    source that fails the same way at each try would print the same line each time; the
    camera says why once, itself."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read(8192).decode(errors="replace")
    for line in text.splitlines():
        line = _AV_PREFIX.sub("", line).strip()
        if line and line not in said:
            said.append(line)


def probe(source: int | str, backend: str) -> str | None:
    """What `robotd check` asks of a source: a file opens and delivers a first frame, a
    device path exists (a device is not opened: the running daemon may hold it; an index
    or a URL is not looked at). None when so, else why not ("no such file", "cannot be
    opened (moov atom not found)", ...)."""
    src = CaptureSource(source, backend)
    if src.kind != "file":
        return src.exists()
    try:
        why = src.open(0, 0, 0.0, None)
        return "delivers no frame" if why is None and not src.grab() else why
    finally:
        src.release()


class PatternSource:
    """A moving test pattern (colour bars drifting sideways, a frame counter band), BGR."""

    kind = "pattern"

    def __init__(self, width: int, height: int) -> None:
        bars = np.array(
            [[255, 255, 255], [0, 255, 255], [255, 255, 0], [0, 255, 0],
             [255, 0, 255], [0, 0, 255], [255, 0, 0], [0, 0, 0]],
            dtype=np.uint8,
        )  # fmt: skip
        columns = (np.arange(width) * len(bars) // max(1, width)).clip(0, len(bars) - 1)
        self._base = np.broadcast_to(bars[columns], (height, width, 3)).copy()
        self._n = 0
        self.width, self.height = width, height

    def open(self, width: int, height: int, fps: float, fourcc: str | None) -> str | None:
        return None

    def granted(self) -> Granted:
        return Granted(self.width, self.height, 0.0, "pattern")

    def grab(self) -> bool:
        self._n += 1
        return True

    def retrieve(self) -> np.ndarray:
        frame = np.roll(self._base, self._n * 4, axis=1)
        band = max(1, self.height // 16)
        frame[:band] = self._n % 256  # the frame counter, readable in a test
        return frame

    def rewind(self) -> bool:
        return True

    def release(self) -> None:
        pass

    def describe(self) -> str:
        return "test pattern"
