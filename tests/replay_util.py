"""A control lane driven by hand, recorded as the daemon records one: the real kernel and
tick (TickIO) on the real sim arm (drivers.sim, in process memory on a virtual clock), the
real Recorder over a real TraceStore, and a test playing the main process: it answers asks
after a delay, and at chosen ticks sends what the main process can send (bad chunks, a
late answer, act failures, a worker-side reset, a new contract, stop, e-stop). The one
thing not real: `Flaky` makes chosen joint reads fail (what a serial timeout does)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from drivers.sim.virtual import VirtualRig
from robotd.config import Config, load_config
from robotd.control.kernel import Kernel
from robotd.control.playback import Chunk
from robotd.control.tick import TickIO
from robotd.lane.messages import Ask, ChunkRows, Rows
from robotd.runtime.recorder import Recorder
from robotd.trace import codec
from robotd.trace.mcapfile import McapFile
from robotd.trace.reader import read_all
from robotd.trace.rundir import RUN_JSON
from robotd.trace.schemas import spec_for
from robotd.trace.store import TraceStore
from robotd.virtual.runner import T0_NS, VirtualClock


class Flaky:
    """The sim arm whose reads fail on the calls numbered in `fail` (1-based)."""

    def __init__(self, arm: Any, fail: set[int]) -> None:
        self.arm, self.fail, self.reads = arm, fail, 0

    def read(self) -> Any:
        self.reads += 1
        if self.reads in self.fail:
            raise OSError("no reply within the deadline (injected)")
        return self.arm.read()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.arm, name)


def rows_for(s: int, n: int = 12) -> np.ndarray:
    t = (s + np.arange(n, dtype=float)) / 30.0
    return np.stack([0.5 * np.sin(t), 0.4 * np.cos(0.7 * t) - 0.3, 0.5 + 0.4 * np.sin(2 * t)], 1)


def answer(ask: Ask) -> np.ndarray | str:
    """The test policy's answer to each ask: mostly smooth rows, and by ask id the awkward
    ones (a NaN, a wrong width, a gripper just and far out of its limits, a jump the rate
    limit clamps) or a failure (a str)."""
    rows = rows_for(ask.s)
    kind = ask.id % 9
    if kind == 3:
        rows[2, 1] = math.nan  # refused whole by the queue: bad_chunk
    elif kind == 4:
        return rows[:, :2].copy()  # two columns for three joints: bad_chunk
    elif kind == 5:
        rows[:, 2] = 1.03  # within the clip tolerance: clipped
    elif kind == 6:
        rows[1:4, 2] = 1.5  # beyond it: rejected, held
    elif kind == 7:
        rows[:, 0] += 0.6  # a jump: clamped by max_velocity
    elif kind == 8:
        return "act failed: TimeoutError (scripted)"
    return rows


class HandLane:
    """One kernel and its recorder on a virtual clock; `tick()` is one control tick."""

    def __init__(self, root: Path, *overrides: str, fail_reads: set[int] = frozenset(),
                 delay: int | Callable[[Ask], int] = 3) -> None:
        self.cfg: Config = load_config(None, ["cameras={}", 'robot.start="idle"', *overrides])
        self.clock = VirtualClock(T0_NS)
        self.store = TraceStore(root, 1 << 30, self.cfg.model_dump(mode="json"), frames=False)
        self.rec = Recorder(self.store, clock=self.clock, wall_offset_ns=0)
        self.batch: list[Any] = []
        self.kernel = Kernel(self.cfg, run_id="hand", emit=self.batch.append)
        self.rig = VirtualRig(self.cfg.joints.names, self.cfg.joints.options, {}, self.clock)
        self.rig.arm.open()
        self.io = TickIO(self.kernel, Flaky(self.rig.arm, set(fail_reads)), dict,
                         lambda op, exc: None, clock=self.clock)
        self.io.start()
        self.delay = delay
        self.index = 0
        self.due: dict[int, list[Callable[[], None]]] = {}
        self.asks: list[Ask] = []
        self.played: list[np.ndarray | None] = []

    def between(self, action: Callable[[], Any]) -> None:
        """Something the main process sends, taken by the lane before the next tick."""
        action()
        self.flush()

    def flush(self) -> None:
        for msg in self.batch:
            self.rec.feed(msg)
        self.batch.clear()

    def deliver(self, ask_id: int, wep: str, step: int, rows: np.ndarray) -> None:
        self.rec.sent(ChunkRows(ask_id, wep, step, Rows.of(rows)))
        self.kernel.deliver(Chunk(ask_id, wep, step, np.array(rows)))

    def tick(self, skipped: int = 0) -> None:
        for action in self.due.pop(self.index, []):
            self.between(action)
        self.clock.now_ns = T0_NS + round(self.index * 1e9 / self.cfg.control.hz)
        self.played.append(self.io.run(self.clock.now_ns, skipped))
        for ask in [m for m in self.batch if isinstance(m, Ask)]:
            self.asks.append(ask)
            delay = self.delay(ask) if callable(self.delay) else self.delay
            self.due.setdefault(self.index + delay, []).append(self._answer(ask))
        self.flush()
        self.index += 1

    def _answer(self, ask: Ask) -> Callable[[], None]:
        got = answer(ask)
        if isinstance(got, str):
            return lambda: self.kernel.act_failed(ask.id, got)
        return lambda: self.deliver(ask.id, ask.wep, ask.s, got)

    def close(self) -> Path:
        self.flush()
        self.store.close()
        self.rig.close()
        assert self.store.run_dir is not None
        return self.store.run_dir


def rewrite(src: Path, dst_dir: Path, change: Callable[[str, dict[str, Any]], Any]) -> Path:
    """A copy of episode file `src` (and its run.json) in `dst_dir`, each record passed
    through `change(topic, record)`: a record back (changed or not), a (topic, record) to
    move it to another channel, or None to leave it out."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    (dst_dir / RUN_JSON).write_text((src.parent / RUN_JSON).read_text())
    messages, reader = read_all(src)
    meta = change("meta", dict(reader.episode)) or reader.episode
    out = McapFile(dst_dir / src.name, meta, fsync=False)
    for m in messages:
        topic, record = m.topic, change(m.topic, json.loads(json.dumps(m.record)))
        if isinstance(record, tuple):
            topic, record = record
        if record is not None:
            out.add(spec_for(topic), m.log_time, codec.encode(record))
    out.finish(reader.end or {})
    return dst_dir / src.name
