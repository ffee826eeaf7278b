"""USB cameras, video files and streams through OpenCV.

The source is a device index (0), a /dev/video path, a video file or a URL. A device is
asked for the configured size and rate and a FOURCC (MJPG by default, which USB cameras
need for 640x480 at 30 fps and up); what it grants is reported, with a warning when it
differs. Every frame is fitted to the configured (height, width) and written RGB with its
capture time (taken when the grab returns). When the source fails (a camera unplugged, a
stream dropped, a file that ended and does not loop) the camera reconnects with backoff
and says so; after `reconnect_timeout_s` without a frame it gives up (DriverFault). When
there is no device at open, `fallback` may serve a test pattern or a video file instead,
said in the log.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import ClassVar

import cv2
import numpy as np

from drivers.base import (
    Camera,
    CameraSpec,
    DriverContext,
    DriverFault,
    DriverOptions,
    FrameSink,
)
from drivers.opencv.options import OpenCVOptions, beside_config, preflight
from drivers.opencv.source import CaptureSource, PatternSource


class OpenCVCamera(Camera):
    Options: ClassVar[type[DriverOptions]] = OpenCVOptions

    def __init__(self, spec: CameraSpec, options: OpenCVOptions, context: DriverContext) -> None:
        self.spec = spec
        self.options = options
        self.context = context
        self.src: CaptureSource | PatternSource | None = None
        self.granted = None
        self.fallback_used = ""
        self.reconnects = 0
        self._period_ns = int(1e9 / spec.fps)
        self._next_ns = 0
        self._lost_at = 0  # context clock, ns
        self._tries = 0

    # ---- the contract ------------------------------------------------------------------

    def open(self) -> None:
        _quiet_opencv()
        o = self.options
        src = self._source()
        why = self._start(src)
        if why is None:
            return
        key = f"cameras.{self.spec.name}.options"
        if o.fallback == "none":
            raise DriverFault(f"camera {self.spec.name!r}: {src.describe()}: {why} ({key}.source)")
        self.fallback_used = o.fallback
        if self._start(self._source(), quiet=True) is not None:
            raise DriverFault(
                f"camera {self.spec.name!r}: {src.describe()}: {why} ({key}.source), and "
                f"the fallback {o.fallback!r} cannot be opened either ({key}.fallback)"
            )
        self.context.warn(
            f"no camera at {o.source!r} ({why}): serving "
            f"{'a test pattern' if o.fallback == 'pattern' else 'the video file ' + o.fallback} "
            f"instead (fallback = {o.fallback!r})"
        )

    def capture(self, sink: FrameSink) -> int:
        while not self.context.stopping():
            src = self.src
            if src is None:
                if not self._reconnect():
                    return -1
                continue
            if src.kind != "device" and not self._pace():
                return -1
            if not src.grab() and not (self._loops() and src.rewind() and src.grab()):
                self._lost("the source ended" if src.kind == "file" else "no frame")
                continue
            t = self.context.clock()
            frame = src.retrieve()
            if frame is None:
                raise ValueError(f"camera {self.spec.name!r}: a frame that does not decode")
            view = sink.begin()
            try:
                fit_into(frame, view, self.options.fit)
            except Exception:
                sink.abort()
                raise
            return sink.commit(t)
        return -1

    def close(self) -> None:
        src, self.src = self.src, None
        if src is not None:
            src.release()

    # ---- pieces ------------------------------------------------------------------------

    def _source(self) -> CaptureSource | PatternSource:
        """The configured source, or the fallback once it is in use."""
        used = self.fallback_used
        if used == "pattern":
            return PatternSource(self.spec.width, self.spec.height)
        if used:
            return CaptureSource(self._beside_config(used), "any")
        return CaptureSource(self._beside_config(self.options.source), self.options.backend)

    def _beside_config(self, source: int | str) -> int | str:
        return beside_config(source, self.context.config_dir)

    @classmethod
    def preflight(cls, options: DriverOptions, config_dir: Path | None) -> str | None:
        """What `robotd check` refuses before anything runs: a source that can never
        deliver (a file that is missing or does not decode, a /dev path or device index
        naming nothing, a malformed stream URL) without a usable fallback (the rules:
        drivers.opencv.options). None when fine, else "KEY: SOURCE: why" (KEY under the
        camera's options)."""
        assert isinstance(options, OpenCVOptions)
        return preflight(options, config_dir)

    def _start(self, src: CaptureSource | PatternSource, quiet: bool = False) -> str | None:
        s, fourcc = self.spec, self.options.fourcc if src.kind == "device" else None
        why = src.open(s.width, s.height, s.fps, fourcc)
        if why is None and not src.grab():
            src.release()
            why = "delivers no frame"
        if why is not None:
            return why
        self.src = src
        self.granted = src.granted()
        self._next_ns = self.context.clock()
        if not quiet:
            self._report(src)
        return None

    def _report(self, src: CaptureSource | PatternSource) -> None:
        g, s = self.granted, self.spec
        asked = f"{s.width}x{s.height}"
        got = f"{g.width}x{g.height}"
        if src.kind == "device":
            asked += f" @ {s.fps:g} fps {self.options.fourcc}".rstrip()
            got += f" @ {g.fps:g} fps {g.fourcc}"
        if got != asked:
            self.context.warn(
                f"{src.describe()}: asked {asked}, granted {got}; frames are fitted to "
                f"{s.width}x{s.height} ({self.options.fit})"
            )

    def _loops(self) -> bool:
        return self.src is not None and self.src.kind in ("file", "pattern") and self.options.loop

    def _pace(self) -> bool:
        """Files and patterns come as fast as asked: play them at the configured rate."""
        self._next_ns = max(self._next_ns + self._period_ns, self.context.clock() - self._period_ns)
        return self.context.sleep_until(self._next_ns) and not self.context.stopping()

    def _lost(self, why: str) -> None:
        src, self.src = self.src, None
        if src is not None:
            src.release()
        self._lost_at = self.context.clock()
        self._tries = 0
        self.context.warn(f"camera {self.spec.name!r} lost ({why}): reconnecting")

    def _reconnect(self) -> bool:
        """One try after the backoff; False when stopping. DriverFault past the timeout."""
        o = self.options
        waited = (self.context.clock() - self._lost_at) / 1e9
        if waited > o.reconnect_timeout_s:
            raise DriverFault(
                f"camera {self.spec.name!r}: no frame for {waited:.0f} s after {self._tries} "
                f"reconnect tries ({o.source!r})"
            )
        delay = min(o.backoff_max_s, o.backoff_min_s * 2 ** min(self._tries, 16))
        if not self.context.sleep_until(self.context.clock() + int(delay * 1e9)):
            return False
        self._tries += 1
        if self._start(self._source(), quiet=True) is None:
            self.reconnects += 1
            self.context.warn(
                f"camera {self.spec.name!r} reconnected after {self._tries} tries "
                f"({(self.context.clock() - self._lost_at) / 1e9:.1f} s)"
            )
        return True


def _quiet_opencv() -> None:
    """Errors only: OpenCV's own warnings about an absent device are ours to say, once."""
    with contextlib.suppress(AttributeError):
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)


def fit_into(frame: np.ndarray, out: np.ndarray, mode: str) -> None:
    """Convert a BGR (or gray, BGRA) frame to RGB and fit it into `out` (h, w, 3):
    stretch, crop (centre, keep aspect) or pad (letterbox, black)."""
    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.size == 0:
        raise ValueError(f"not an image: {type(frame).__name__}")
    if frame.ndim == 2 or (frame.ndim == 3 and frame.shape[2] == 1):
        code = cv2.COLOR_GRAY2RGB
    elif frame.ndim == 3 and frame.shape[2] == 4:
        code = cv2.COLOR_BGRA2RGB
    elif frame.ndim == 3 and frame.shape[2] == 3:
        code = cv2.COLOR_BGR2RGB
    else:
        raise ValueError(f"not an image: shape {frame.shape}")
    h, w = out.shape[:2]
    fh, fw = frame.shape[:2]
    if (fh, fw) == (h, w):
        cv2.cvtColor(frame, code, dst=out)
        return
    if mode == "crop":
        scale = max(w / fw, h / fh)
        cw, ch = min(fw, round(w / scale)), min(fh, round(h / scale))
        x, y = (fw - cw) // 2, (fh - ch) // 2
        frame = frame[y : y + ch, x : x + cw]
    if mode == "pad":
        scale = min(w / fw, h / fh)
        tw, th = max(1, round(fw * scale)), max(1, round(fh * scale))
        out[:] = 0
        x, y = (w - tw) // 2, (h - th) // 2
        small = cv2.resize(frame, (tw, th), interpolation=_filter(fw, tw))
        out[y : y + th, x : x + tw] = cv2.cvtColor(small, code)
        return
    small = cv2.resize(frame, (w, h), interpolation=_filter(frame.shape[1], w))
    cv2.cvtColor(small, code, dst=out)


def _filter(src_width: int, dst_width: int) -> int:
    return cv2.INTER_AREA if dst_width < src_width else cv2.INTER_LINEAR
