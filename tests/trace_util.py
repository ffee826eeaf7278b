"""Helpers for the trace tests: records of every channel, a sink that can stall the writer."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import numpy as np

from robotd.trace.schemas import ChannelSpec

CONFIG = {"control": {"hz": 30.0}, "joints": {"names": ["shoulder", "elbow", "gripper"]}}


def tick(s: int, *, wep: str = "w1", ep: int = 1) -> dict[str, Any]:
    return {
        "ep": ep, "wep": wep, "s": s, "t_ns": 1_000_000 * s,
        "pos": [0.1 * s, -0.0, 1e-300 * s], "vel": [0.5, 0.25, 0.0],
        "target": [0.1 * s + 0.01, 0.0, 1.0] if s % 5 else None,
        "held": s % 5 == 0, "shield": ("", "clipped", "clamped", "rejected")[s % 4],
        "ok": s % 7 != 0, "skipped": s % 11 == 0,
    }


def every_kind(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    """One record of each non-camera channel, with the awkward values each may carry."""
    rows = rng.standard_normal((8, 3))
    rows[2, 1] = math.nan
    rows[3, 0] = math.inf
    rows[4, 2] = -math.inf
    rows[5, 0] = -0.0
    rows[6, 1] = 5e-324  # the smallest subnormal
    return [
        ("/robot/tick", tick(3) | {"pos": [math.nan, 1.0, -math.inf]}),
        ("/policy/ask", {"id": 7, "wep": "w1", "s": 12, "queue": 2, "delay": 3}),
        ("/policy/chunk", {"ask": 7, "wep": "w1", "from": 12, "at": 15, "rows": rows,
                           "dropped": 3, "stale": False}),
        ("/events", {"name": "hold_start", "tick": 40, "detail": {"why": "starved", "n": 1}}),
        ("/operator", {"cmd": "start", "args": {"task": "pick / place ~ő"}, "ok": False,
                       "error": "not idle"}),
        ("/link", {"kind": "episode_reset", "detail": {"cause": "worker lost", "wep": "w2"}}),
    ]


def same(a: Any, b: Any) -> bool:
    """Equal as traced: arrays by their float64 bits, NaN equal to NaN."""
    if isinstance(a, np.ndarray):
        b = np.asarray(b, dtype=np.float64)
        return a.shape == b.shape and a.astype(np.float64).tobytes() == b.tobytes()
    if isinstance(a, float) and isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes() or (a != a and b != b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


class GateSink:
    """A live-view sink whose publish waits on a gate: it stalls the writer thread on demand,
    so a test can fill the queue deterministically. It also keeps what it was handed."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.seen: list[tuple[str, int, bytes]] = []
        self.closed = False

    def publish(self, spec: ChannelSpec, log_time_ns: int, data: bytes) -> None:
        self.entered.set()
        self.gate.wait(30)
        self.seen.append((spec.topic, log_time_ns, data))

    def close(self) -> None:
        self.closed = True


def only_run(root: Path) -> Path:
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]
