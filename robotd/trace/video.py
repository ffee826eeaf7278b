"""Frames at the control rate, encoded as MP4 with OpenCV's VideoWriter.

Codecs: ``mp4v`` (MPEG-4 Part 2, yuv420p; the default: fast, and every FFmpeg-based
decoder reads it, LeRobot's included) or ``vp9`` (VP9 at constant quality, CRF
`VP9_CRF`: about a third of mp4v's bytes at about its fidelity, but six to eight times
the export's time; measured in docs/trace.md). Without a CRF, OpenCV's VP9 runs at libvpx's
default bitrate, which made files larger than mp4v's: the CRF is what makes vp9 worth
choosing, so an OpenCV that cannot set it is warned about.
Each output frame is the newest camera frame at its tick: the frame the robot had then
(by the frame index the tick recorded, where it did).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

CODECS = {"mp4v": ("mp4v", "mpeg4"), "vp9": ("vp09", "vp9")}  # fourcc, FFmpeg's codec name
# libvpx's constant-quality level for vp9 (0 best .. 63): 31 kept a moving-arm 640x480
# recording within 0.3 dB PSNR of mp4v's at a third of its size (docs/trace.md)
VP9_CRF = 31

log = logging.getLogger("robotd.trace")


class VideoError(RuntimeError):
    """A video that cannot be written; the text says which and why."""


@dataclass(frozen=True)
class VideoInfo:
    frames: int
    width: int
    height: int
    codec: str  # FFmpeg's name, as LeRobot records it
    resized: int  # frames resized to the first frame's size


def frames_at_ticks(
    frames: Iterable[tuple[int, bytes] | tuple[int, bytes, int]],
    tick_times: np.ndarray,
    tick_refs: np.ndarray | None = None,
) -> Iterator[np.ndarray]:
    """For each tick, the newest decoded frame it had (before the first frame: the first
    frame). `frames` are (capture time, bytes[, frame index]) in file order, which is time
    order but for a frame recorded late: one older than the frame shown is skipped.

    A tick had a frame when the frame's index is at most the one the tick referenced
    (`tick_refs`, the /robot/tick `cams` index, -1 for none): exactly the frame the control
    lane read at that tick, whichever way capture and tick times straddle. Without an index
    on either side, when it was captured at or before the tick's time."""
    it = iter(frames)
    current: np.ndarray | None = None
    current_t: int | None = None
    current_i = -1
    pending = next(it, None)

    def decode(item: tuple[int, bytes] | tuple[int, bytes, int]) -> np.ndarray | None:
        img = cv2.imdecode(np.frombuffer(item[1], np.uint8), cv2.IMREAD_COLOR)
        return img if img is not None and img.ndim == 3 else None

    for n, t in enumerate(tick_times):
        ref = int(tick_refs[n]) if tick_refs is not None else -1
        # take every frame the tick had (and, before the first one, the first one)
        while pending is not None and (current is None or _had(pending, t, ref)):
            index = _index(pending)
            # a frame recorded late (re-uploaded, or an older window step) never takes the
            # place of a newer one: the video does not step back in time
            if index >= 0 and current_i >= 0:
                newer = index >= current_i
            else:
                newer = current_t is None or current_t > t or pending[0] >= current_t
            if newer:
                img = decode(pending)
                if img is not None:
                    current, current_t, current_i = img, pending[0], index
            pending = next(it, None)
        if current is None:
            raise VideoError("no frame decodes")
        yield current


def first_frame_size(
    frames: Iterable[tuple[int, bytes] | tuple[int, bytes, int]],
) -> tuple[int, int] | None:
    """(width, height) of the first frame of `frames` that decodes, None when none does.

    That is the size `write_video` gives a camera's whole video (`frames_at_ticks` shows
    the first decodable frame first, and every later frame is resized to it), so an export
    can compare episodes' sizes before it encodes anything. Only frames up to the first
    good one are read (and one decoded, of each bad one before it)."""
    for item in frames:
        img = cv2.imdecode(np.frombuffer(item[1], np.uint8), cv2.IMREAD_COLOR)
        if img is not None and img.ndim == 3:
            return img.shape[1], img.shape[0]
    return None


def _index(item: tuple[int, bytes] | tuple[int, bytes, int]) -> int:
    return int(item[2]) if len(item) > 2 else -1  # type: ignore[misc]


def _had(item: tuple[int, bytes] | tuple[int, bytes, int], t: int, ref: int) -> bool:
    index = _index(item)
    return index <= ref if index >= 0 and ref >= 0 else item[0] <= t


def write_video(path: Path, frames: Iterable[np.ndarray], fps: int, codec: str) -> VideoInfo:
    """Write BGR frames as an MP4 at `fps`; every frame is resized to the first one's size."""
    fourcc, name = CODECS[codec]
    writer = None
    count = resized = 0
    size = (0, 0)
    try:
        for img in frames:
            if writer is None:
                size = (img.shape[1], img.shape[0])
                path.parent.mkdir(parents=True, exist_ok=True)
                writer = _open_writer(path, codec, fourcc, fps, size)
                if not writer.isOpened():
                    raise VideoError(f"{path}: OpenCV cannot write {codec} here")
            if (img.shape[1], img.shape[0]) != size:
                img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
                resized += 1
            writer.write(img)
            count += 1
    finally:
        if writer is not None:
            writer.release()
    if count == 0:
        raise VideoError(f"{path}: no frames")
    return VideoInfo(count, size[0], size[1], name, resized)


def _open_writer(path: Path, codec: str, fourcc: str, fps: int,
                 size: tuple[int, int]) -> cv2.VideoWriter:
    """OpenCV's writer for `codec`; vp9 at constant quality `VP9_CRF` where OpenCV's
    FFmpeg backend takes ``VIDEOWRITER_PROP_CRF`` (otherwise at its default bitrate, with a
    warning: those files are larger than mp4v's)."""
    code = cv2.VideoWriter_fourcc(*fourcc)
    crf = getattr(cv2, "VIDEOWRITER_PROP_CRF", None)
    if codec == "vp9" and crf is not None:
        writer = cv2.VideoWriter(str(path), cv2.CAP_FFMPEG, code, fps, size, [crf, VP9_CRF])
        if writer.isOpened() and writer.get(crf) == VP9_CRF:
            return writer
        writer.release()
        path.unlink(missing_ok=True)
    if codec == "vp9":
        log.warning("export: this OpenCV cannot set VP9's quality (VIDEOWRITER_PROP_CRF); "
                    "vp9 runs at its default bitrate: larger files than mp4v's")
    return cv2.VideoWriter(str(path), code, fps, size)
