"""The trace writer's own cost, for bench/trace.py: per tick record and per frame, on the
calling thread and in the writer thread, and the bytes it writes.

Each round makes a fresh TraceStore (defaults: zstd, flush every 1 s or 1 MiB, fsync at
each flush) in a temporary directory and feeds it, from this thread, first `records` tick
records and then `frames` camera frames (real 640x480 JPEGs). Per record and per frame:
``main_us`` the wall time of EpisodeWriter.write / .frame on the calling thread (what the
daemon's event loop pays), ``writer_us`` the CPU time of the writer thread (JSON, base64,
zstd, file writes, fsync) until everything is on disk, ``bytes`` on disk. Baselines in the
same run: a bare deque.append of the same tuples and json.dumps of the same tick record.
"""

from __future__ import annotations

import collections
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._common import BenchError, median, ratio

CONFIG = {"control": {"hz": 100.0}, "joints": {"names": [f"j{i}" for i in range(7)]}}


def _tick(s: int) -> dict[str, Any]:
    pos = [0.001 * s + 0.1 * j for j in range(7)]
    return {"ep": 1, "wep": "w1", "s": s, "t_ns": s * 10_000_000, "pos": pos,
            "vel": [0.01 * j for j in range(7)], "target": [p + 0.002 for p in pos],
            "held": False, "shield": "", "ok": True, "skipped": False}


VARIANTS = 64  # distinct frames, cycled: no chunk holds the same frame twice


def _jpegs() -> list[bytes]:
    """640x480 JPEGs of a scene with sensor-like noise, each one different (zstd would
    otherwise find a repeated frame inside a chunk and the bytes would be a lie)."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for k in range(VARIANTS):
        img = np.zeros((480, 640, 3), np.uint8)
        img[:] = np.linspace(20, 200, 640, dtype=np.uint8)[None, :, None]
        cv2.circle(img, (200 + 3 * k, 240), 90, (30, 160, 230), -1)
        cv2.rectangle(img, (60, 300), (220, 420), (200, 60, 40), -1)
        img = cv2.add(img, rng.integers(0, 24, img.shape, dtype=np.uint8))
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 85])
        if not ok:
            raise BenchError("OpenCV cannot encode a JPEG here")
        out.append(buf.tobytes())
    return out


def _thread_cpu(thread: threading.Thread) -> float:
    if thread.ident is None:
        raise BenchError("the writer thread has not started")
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _round(records: int, frames: int, jpegs: list[bytes]) -> dict[str, float]:
    from robotd.trace.store import TraceStore

    ticks = [_tick(s) for s in range(records)]
    with tempfile.TemporaryDirectory(prefix="robotd-bench-trace-") as tmp:
        store = TraceStore(tmp, 1 << 40, CONFIG, queue_records=records + frames + 16,
                           queue_bytes=(frames + 1) * max(map(len, jpegs)))
        writer_thread = store._thread  # the bench reads its CPU clock
        ep = store.begin_episode(1, "w1", "bench")
        if not store.flush():
            raise BenchError("the trace writer did not start")
        t0, cpu0 = time.perf_counter(), _thread_cpu(writer_thread)
        for s, rec in enumerate(ticks):
            ep.write("/robot/tick", 1_000 + s, rec)
        main_ticks = time.perf_counter() - t0
        if not store.flush(120):
            raise BenchError("the trace writer did not drain the ticks in 120 s")
        cpu_ticks = _thread_cpu(writer_thread) - cpu0
        size_ticks = _size(store.run_dir)
        t0, cpu0 = time.perf_counter(), _thread_cpu(writer_thread)
        for i in range(frames):
            ep.frame("top", 2_000 + i, jpegs[i % VARIANTS], i)
        main_frames = time.perf_counter() - t0
        if not store.flush(120):
            raise BenchError("the trace writer did not drain the frames in 120 s")
        cpu_frames = _thread_cpu(writer_thread) - cpu0
        size_frames = _size(store.run_dir) - size_ticks
        dropped = store.stats().dropped_records + store.stats().dropped_frames
        ep.end("stopped")
        store.close()
    if dropped:
        raise BenchError(f"{dropped} records dropped: the queue was too small for the bench")
    return {
        "tick_main_us": main_ticks / records * 1e6, "tick_writer_us": cpu_ticks / records * 1e6,
        "tick_bytes": size_ticks / records, "frame_main_us": main_frames / frames * 1e6,
        "frame_writer_us": cpu_frames / frames * 1e6, "frame_bytes": size_frames / frames,
    }


def _size(run: Path | None) -> int:
    return sum(p.stat().st_size for p in run.glob("*.mcap")) if run else 0


def _baselines(records: int) -> dict[str, float]:
    ticks = [("m", 1, "/robot/tick", s, _tick(s)) for s in range(records)]
    q: collections.deque = collections.deque()
    t0 = time.perf_counter()
    for item in ticks:
        q.append(item)
    append_us = (time.perf_counter() - t0) / records * 1e6
    t0 = time.perf_counter()
    for item in ticks:
        json.dumps(item[4], separators=(",", ":"))
    json_us = (time.perf_counter() - t0) / records * 1e6
    return {"append_us": append_us, "json_us": json_us}


def run(records: int, frames: int, rounds: int) -> dict[str, Any]:
    """Medians over `rounds` of the writer's costs and of the baselines."""
    jpegs = _jpegs()
    per = [_round(records, frames, jpegs) for _ in range(rounds)]
    base = [_baselines(records) for _ in range(rounds)]
    m = {k: round(median(r[k] for r in per), 3) for k in per[0]}
    b = {k: round(median(r[k] for r in base), 3) for k in base[0]}
    return {**m, "append_us": b["append_us"], "json_us": b["json_us"],
            "jpeg_bytes": round(sum(map(len, jpegs)) / len(jpegs)),
            "tick_main_per_append": ratio(m["tick_main_us"], b["append_us"], 1),
            "tick_writer_per_json": ratio(m["tick_writer_us"], b["json_us"], 1)}
