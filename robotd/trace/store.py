"""The trace store: what the daemon's main process calls to record what the robot did.

Every call here is made on the event loop and returns at once: it puts a tuple on a
bounded queue (`Outbox`) and the writer thread (`robotd.trace.writer`) does the rest.
A full queue drops the record, counts it, and the writer records the drop as an event.

    store = TraceStore(root, max_bytes=4 << 30, config_snapshot=cfg.model_dump(mode="json"))
    ep = store.begin_episode(1, worker_episode="w1", task="pick the cube")
    ep.write("/robot/tick", time.time_ns(), {...})
    ep.frame("top", time.time_ns(), jpeg_bytes, frame_index)
    ep.end("stopped", verdict={"success": True, "notes": ""})
    store.close()
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robotd.trace.outbox import Outbox
from robotd.trace.rundir import (
    RESERVE,
    RUN_JSON,
    RunLock,
    make_reserve,
    make_run_dir,
    read_json,
    run_info,
    write_json_atomic,
)
from robotd.trace.schemas import CHANNELS, TICK, camera_topic, valid_camera_name
from robotd.trace.writer import Sink, WriterSettings, WriterThread

log = logging.getLogger("robotd.trace")
_TOPICS = frozenset(CHANNELS)


@dataclass(frozen=True)
class TraceStats:
    records: int  # written by the writer thread
    frames: int
    bytes: int  # message bytes written (before compression)
    dropped_records: int  # the queue was full
    dropped_frames: int
    queued: int
    errors: int  # records that could not be encoded or written (logged)
    runs_deleted: int  # by the disk budget
    alive: bool  # the writer thread runs
    frames_lost: int = 0  # overwritten in their camera ring before the recorder read them
    encoded: int = 0  # frames the writer thread JPEG-encoded (given as pixels)
    encode_s: float = 0.0  # the time it spent encoding them
    writer_cpu_s: float = 0.0  # the writer thread's CPU time so far


class EpisodeWriter:
    """One operator-level episode's trace. Methods return at once; False means dropped."""

    def __init__(self, store: TraceStore, key: int, episode: int) -> None:
        self._store, self._key, self.episode = store, key, episode
        self._ticks = 0
        self.ended = False

    def write(self, channel: str, log_time_ns: int, record: Any) -> bool:
        """Record `record` (a dict, or a struct/dataclass of the channel's fields) on
        `channel` at `log_time_ns` (ns since the Unix epoch). The record is the writer's
        from now on: don't change it afterwards. Ticks are decimated by ``tick_every``."""
        if channel not in _TOPICS:
            raise ValueError(f"trace: no channel {channel!r} (one of {sorted(_TOPICS)})")
        if channel is TICK or channel == TICK:
            self._ticks += 1
            if (self._ticks - 1) % self._store.tick_every:
                return True
        return self._store._outbox.put(("m", self._key, channel, log_time_ns, record))

    def frame(
        self, camera: str, log_time_ns: int, jpeg: bytes, frame_index: int, fmt: str = "jpeg"
    ) -> bool:
        """Record a camera frame as it was handed to the policy (compressed bytes)."""
        return self._store._frame(self._key, camera, log_time_ns, jpeg, frame_index, fmt)

    def frame_room(self, nbytes: int) -> bool:
        """Whether a frame of `nbytes` pixels would be taken now (False: it is counted as
        dropped already, like one frame_pixels refused; don't copy it)."""
        return self._store._frame_room(nbytes)

    def frame_pixels(
        self, camera: str, log_time_ns: int, pixels: np.ndarray, frame_index: int
    ) -> bool:
        """Record a frame given as pixels (HWC uint8 RGB, an array of its own: never a view
        of a camera ring); the writer thread encodes it as JPEG."""
        return self._store._pixels(self._key, camera, log_time_ns, pixels, frame_index)

    def end(
        self,
        outcome: str,
        verdict: dict[str, Any] | None = None,
        log_time_ns: int | None = None,
        *,
        tick: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Close the episode's file cleanly (a verdict given later goes to `store.verdict`).
        `tick` and `detail` (the control lane's word on the end) go into its episode_end
        event."""
        if not self.ended:
            self.ended = True
            t = time.time_ns() if log_time_ns is None else log_time_ns
            self._store._end(self, outcome, verdict, t, tick, detail)


class TraceStore:
    """A run directory under `root_dir` for this daemon start, one MCAP file per episode.

    `root_dir` None records nothing to disk (a live view alone). Construction makes the
    run directory and writes ``run.json``; it raises OSError when that is impossible."""

    def __init__(
        self,
        root_dir: Path | str | None,
        max_bytes: int,
        config_snapshot: dict[str, Any],
        *,
        tick_every: int = 1,
        frames: bool = True,
        frame_quality: int = 85,
        flush_s: float = 1.0,
        flush_bytes: int = 1 << 20,
        fsync: bool = True,
        compression: str = "zstd",
        queue_records: int = 16384,
        queue_bytes: int = 64 << 20,
        live: Sink | None = None,
    ) -> None:
        if tick_every < 1:
            raise ValueError(f"trace: tick_every must be >= 1, got {tick_every}")
        self.tick_every = tick_every
        self.frames_on = frames
        self.frames_lost = 0  # counted by the recorder (robotd.runtime.camera_frames)
        self._outbox = Outbox(queue_records, queue_bytes)
        self._next_key = 0
        self._current: EpisodeWriter | None = None
        self._lock: RunLock | None = None
        self.run_dir: Path | None = None
        if root_dir is not None:
            started = dt.datetime.now(dt.UTC)
            self.run_dir = make_run_dir(Path(root_dir), started)
            self._lock = RunLock(self.run_dir)
            write_json_atomic(self.run_dir / RUN_JSON, run_info(config_snapshot, started))
            make_reserve(self.run_dir)  # room for the ends should the disk fill up
            log.info("trace: recording to %s", self.run_dir)
        meta = (("hz", _hz(config_snapshot)), ("tick_every", tick_every),
                ("joints", _joint_names(config_snapshot)))
        settings = WriterSettings(flush_s=flush_s, flush_bytes=flush_bytes, fsync=fsync,
                                  compression=compression, max_bytes=max_bytes,
                                  episode_meta=meta, frame_quality=frame_quality)
        self._thread = WriterThread(self._outbox, self.run_dir, settings, live)
        self._thread.start()
        self._closed = False

    # ---- what the daemon calls
    def begin_episode(
        self,
        episode: int,
        worker_episode: str,
        task: str | None,
        log_time_ns: int | None = None,
        *,
        tick: int | None = None,
    ) -> EpisodeWriter:
        """Open episode `episode`'s file (an episode still open is ended as ``superseded``).
        `log_time_ns` (default now) stamps its episode_start event, `tick` (the control
        lane's tick count) goes into it."""
        if not isinstance(episode, int) or not 0 <= episode < 10**9:
            raise ValueError(f"trace: episode must be an int in [0, 1e9), got {episode!r}")
        if self._current is not None:
            self._current.ended = True
        self._next_key += 1
        writer = EpisodeWriter(self, self._next_key, episode)
        self._current = writer
        task = None if task is None else str(task)[:10_000]
        t = time.time_ns() if log_time_ns is None else log_time_ns
        self._outbox.put_control(
            ("begin", writer._key, episode, str(worker_episode), task, t, tick))
        return writer

    def write(self, channel: str, log_time_ns: int, record: Any) -> bool:
        """Record into the open episode, or into the run's session file between episodes."""
        if self._current is not None:
            return self._current.write(channel, log_time_ns, record)
        if channel not in _TOPICS:
            raise ValueError(f"trace: no channel {channel!r} (one of {sorted(_TOPICS)})")
        return self._outbox.put(("m", None, channel, log_time_ns, record))

    def frame(self, camera: str, log_time_ns: int, jpeg: bytes, frame_index: int) -> bool:
        key = self._current._key if self._current is not None else None
        return self._frame(key, camera, log_time_ns, jpeg, frame_index, "jpeg")

    def verdict(self, episode: int, verdict: dict[str, Any]) -> None:
        """An operator's verdict on `episode`, during it or after it ended."""
        self._outbox.put_control(("verdict", episode, verdict))

    def stats(self) -> TraceStats:
        t, o = self._thread, self._outbox
        return TraceStats(t.records, t.frames, t.bytes, o.dropped_records, o.dropped_frames,
                          len(o), t.errors, t.disk.deleted, t.is_alive(), self.frames_lost,
                          t.encoded, round(t.encode_ns / 1e9, 6), round(t.cpu_ns / 1e9, 6))

    def health(self) -> dict[str, Any] | None:
        """Whether records reach the disk now, for status (None: nothing goes to disk).
        ``recording``; when not, ``refused``: the file, its error, ``disk_full``, since
        when; ``stopped``: the files write errors closed this run; ``lost_ticks``: ticks of
        the open episode that no file holds; ``dropped``: records and frames a full queue
        dropped. Read from the writer thread's state as it stands (plain attributes)."""
        t = self._thread
        if self.run_dir is None:
            return None
        key = t.current
        f = t.disk.files.get(key) if key is not None else None
        recording = (f is not None and not f.broken) if key is not None else t.disk.refused is None
        out: dict[str, Any] = {"recording": recording, "dir": str(self.run_dir)}
        if not t.is_alive() and not self._closed:
            out["recording"] = False
            out["refused"] = {"error": "the trace's writer thread is gone"}
        elif not recording and t.disk.refused is not None:
            out["refused"] = dict(t.disk.refused)
        if t.disk.stopped:
            out["stopped"] = [str(s.get("file")) for s in t.disk.stopped[-8:]]
        if f is not None and f.broken:
            out["lost_ticks"] = f.ticks - f.kept[0]
        o = self._outbox
        if o.dropped_records or o.dropped_frames:
            out["dropped"] = {"records": o.dropped_records, "frames": o.dropped_frames}
        return out

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is on disk (tests, before a summary)."""
        done = threading.Event()
        self._outbox.put_control(("sync", done))
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """End any open episode (outcome ``daemon_stopped``), close every file cleanly and
        stop the writer thread. Blocks up to `timeout`; call it at SIGTERM/SIGINT (from the
        event loop: ``await anyio.to_thread.run_sync(store.close)``)."""
        if self._closed:
            return
        self._closed = True
        self._outbox.put_control(("close",))
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("trace: the writer did not finish within %.0f s; files stay readable "
                      "up to their last flush", timeout)
        if self.run_dir is not None:
            info = read_json(self.run_dir / RUN_JSON) or {}
            s = self.stats()
            info.update(ended=dt.datetime.now(dt.UTC).isoformat(),
                        stats={k: getattr(s, k) for k in TraceStats.__dataclass_fields__})
            if self._thread.disk.stopped:  # files a write error closed: trace ls says so
                info["recording_stopped"] = list(self._thread.disk.stopped)
            try:
                write_json_atomic(self.run_dir / RUN_JSON, info)
            except OSError as exc:
                log.error("trace: cannot update %s: %s", RUN_JSON, exc)
            try:
                (self.run_dir / RESERVE).unlink(missing_ok=True)  # a finished run needs none
            except OSError as exc:  # a directory gone read-only: the lock goes all the same
                log.error("trace: cannot remove %s: %s", RESERVE, exc)
        if self._lock is not None:
            self._lock.release()

    # ---- internals shared with EpisodeWriter
    def _frame(self, key: int | None, camera: str, t: int, jpeg: bytes, index: int,
               fmt: str) -> bool:
        if not self.frames_on:
            return True
        if not valid_camera_name(camera):
            raise ValueError(f"trace: bad camera name {camera!r}")
        return self._outbox.put_frame(("f", key, camera_topic(camera), t, jpeg, index, fmt),
                                      len(jpeg))

    def _frame_room(self, nbytes: int) -> bool:
        return not self.frames_on or self._outbox.take_frame_room(nbytes)

    def _pixels(self, key: int, camera: str, t: int, pixels: np.ndarray, index: int) -> bool:
        if not self.frames_on:
            return True
        if not valid_camera_name(camera):
            raise ValueError(f"trace: bad camera name {camera!r}")
        if not (isinstance(pixels, np.ndarray) and pixels.dtype == np.uint8
                and pixels.ndim == 3 and pixels.shape[2] == 3):
            raise ValueError(f"trace: camera {camera!r}: pixels must be HWC uint8 RGB")
        return self._outbox.put_frame(("p", key, camera_topic(camera), t, pixels, index),
                                      pixels.nbytes)

    def _end(self, writer: EpisodeWriter, outcome: str, verdict: Any, t: int,
             tick: int | None = None, detail: dict[str, Any] | None = None) -> None:
        if self._current is writer:
            self._current = None
        self._outbox.put_control(("end", writer._key, str(outcome), verdict, t, tick, detail))


def _hz(cfg: dict[str, Any]) -> float | None:
    control = cfg.get("control") if isinstance(cfg, dict) else None
    hz = control.get("hz") if isinstance(control, dict) else None
    return float(hz) if isinstance(hz, int | float) else None


def _joint_names(cfg: dict[str, Any]) -> list[str] | None:
    joints = cfg.get("joints") if isinstance(cfg, dict) else None
    names = joints.get("names") if isinstance(joints, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else None
