"""``robotd export RUN_OR_EPISODES... --lerobot DIR``: traces as a LeRobot v3.0 dataset.

Each argument is a run directory (all its episodes) or an episode's ``.mcap`` file.
Joint positions become ``observation.state``, the targets played ``action``, each
camera's frames a video at the control rate, the episode's task its task text; outcome
and verdict go into the episodes table. DIR must not exist (or be empty); the dataset is
built beside it and renamed into place, so a failed export leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from robotd.trace.episode_data import EpisodeData, EpisodeDataError, camera_frames, load_episode
from robotd.trace.reader import TraceError
from robotd.trace.rundir import episode_files
from robotd.trace.video import CODECS, VideoError, first_frame_size

log = logging.getLogger("robotd.trace")


class ExportError(ValueError):
    """An export that cannot be done; the text names the input and why."""


def episode_paths(inputs: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in inputs:
        if p.is_dir():
            found = episode_files(p)
            if not found:
                raise ExportError(f"{p}: no episode files (episode-NNNNNN.mcap) in it")
            out += found
        elif p.is_file() and p.suffix == ".mcap":
            out.append(p)
        else:
            raise ExportError(f"{p}: neither a run directory nor an episode .mcap file")
    return list(dict.fromkeys(out))


def _fps(ep: EpisodeData) -> int:
    rate = ep.rate()
    if rate is None:
        raise ExportError(f"{ep.path}: its trace does not say the control rate (hz)")
    if abs(rate - round(rate)) > 1e-9 or round(rate) < 1:
        raise ExportError(f"{ep.path}: {rate:g} frames per second (control hz / ticks every); "
                          "a LeRobot dataset needs a whole number")
    return round(rate)


def _empty(path: Path) -> bool:
    """A file shorter than MCAP's 8-byte magic: created, nothing of it ever flushed."""
    try:
        return path.stat().st_size < 8
    except OSError:
        return False


def load_all(paths: list[Path]) -> list[EpisodeData]:
    episodes = []
    for path in paths:
        if _empty(path):
            log.warning("export: %s: empty (its writer stopped before the first flush); "
                        "left out", path)
            continue
        try:
            ep = load_episode(path)
        except (TraceError, EpisodeDataError) as exc:
            raise ExportError(str(exc)) from None
        if ep.ticks == 0:
            log.warning("export: %s: no ticks; left out", path)
            continue
        if ep.note:
            log.warning("export: %s", ep.note)
        if skipped := int(ep.skipped.sum()):
            log.warning("export: %s: %d of its %d rows are steps an overrun skipped (first at "
                        "frame %d): they repeat the last observation and action, and count "
                        "as time that passed; the episodes table's robotd/skipped counts them",
                        path, skipped, ep.ticks, int(np.flatnonzero(ep.skipped)[0]))
        episodes.append(ep)
    if not episodes:
        raise ExportError("nothing to export: no episode with ticks")
    first = episodes[0]
    for ep in episodes[1:]:
        if ep.state.shape[1] != first.state.shape[1] or _fps(ep) != _fps(first):
            raise ExportError(f"{ep.path}: {ep.state.shape[1]} joints at {_fps(ep)} fps, but "
                              f"{first.path} has {first.state.shape[1]} at {_fps(first)}")
    return episodes


def check_camera_sizes(episodes: list[EpisodeData], cameras: list[str]) -> None:
    """Refuse (ExportError) a camera whose frames differ in size between episodes, before
    anything is encoded: a LeRobot video feature has one shape. The message names the
    episode that differs, its size and the size of the first episode that set it (a mix
    comes from exporting runs recorded with different `trace.frames`, "policy" being the
    policy's fitted view and "all" the camera's own resolution)."""
    for cam in cameras:
        first: tuple[Path, tuple[int, int]] | None = None
        for ep in episodes:
            with contextlib.closing(camera_frames(ep.path, cam)) as frames:
                size = first_frame_size(frames)
            if size is None:
                continue  # no frame decodes: write_video says so for this episode
            if first is None:
                first = (ep.path, size)
            elif size != first[1]:
                (w, h), (fw, fh) = size, first[1]
                raise ExportError(
                    f"{ep.path}: camera {cam} is {w}x{h}, but {first[0]}'s is {fw}x{fh}; a "
                    "dataset's camera has one size: export episodes recorded with the same "
                    "trace.frames and cameras together")


def export_lerobot(inputs: list[Path], out: Path, *, codec: str = "mp4v",
                   robot_type: str | None = None):
    """Export the episodes of `inputs` into the new dataset directory `out`."""
    from robotd.trace.lerobot import DatasetWriter

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out}: exists and is not empty; choose a new directory")
    episodes = load_all(episode_paths(inputs))
    first = episodes[0]
    joints = first.meta.get("joints")
    if not isinstance(joints, list) or len(joints) != first.state.shape[1]:
        joints = [f"joint{i}" for i in range(first.state.shape[1])]
    cameras = [c for c in first.cameras if all(c in ep.cameras for ep in episodes)]
    for cam in sorted({c for ep in episodes for c in ep.cameras} - set(cameras)):
        log.warning("export: camera %s is missing from some episodes; left out", cam)
    check_camera_sizes(episodes, cameras)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as exc:  # named as the output, not as our temporary beside it
        raise ExportError(f"{out}: cannot be made there: {exc.strerror}") from None
    try:
        writer = DatasetWriter(tmp, _fps(first), [str(j) for j in joints], cameras, codec,
                               robot_type)
        for ep in episodes:
            writer.add(ep)
        summary = writer.finish()
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dataclasses.replace(summary, root=out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="robotd export", description=__doc__.splitlines()[0])
    p.add_argument("inputs", type=Path, nargs="+", metavar="RUN_OR_EPISODE")
    p.add_argument("--lerobot", type=Path, required=True, metavar="DIR",
                   help="write a LeRobot v3.0 dataset into this new directory")
    p.add_argument("--codec", choices=sorted(CODECS), default="mp4v",
                   help="video codec (mp4v: MPEG-4 Part 2, fast; vp9: VP9 at constant "
                        "quality, about a third of mp4v's bytes, 6-8x the export time)")
    p.add_argument("--robot-type", default=None, help="info.json robot_type")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        s = export_lerobot(args.inputs, args.lerobot, codec=args.codec,
                           robot_type=args.robot_type)
    except (ExportError, VideoError, RuntimeError, OSError) as exc:
        print(f"robotd export: {exc}", file=sys.stderr)
        return 2
    cams = ", ".join(s.cameras) or "none"
    eps = f"{s.episodes} episode{'' if s.episodes == 1 else 's'}"
    print(f"{s.root}: LeRobot dataset v3.0, {eps}, {s.frames} frames at "
          f"{s.fps} fps, cameras: {cams}" + (f" ({s.codec})" if s.cameras else ""))
    return 0
