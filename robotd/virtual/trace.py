"""A virtual run recorded as the daemon records one: the same recorder
(robotd.runtime.recorder) fed the same lane messages, each tick's after the tick (as the
control lane sends its batch at the end of the tick: a step's record is complete only
then), and the chunks the asker answers as the main process would send them down. Every
tick is recorded; frames are not (the virtual rig renders only what a window reads)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from robotd.config import Config
from robotd.control.playback import Chunk
from robotd.lane.messages import ChunkRows, Rows
from robotd.runtime.recorder import Recorder
from robotd.trace.store import TraceStore


class VirtualTrace:
    """A run directory under `root` for one virtual run; `emit` every kernel message,
    `chunk` every answer, `flush` after each tick, `close` at the end."""

    def __init__(self, cfg: Config, clock: Any, root: Path | str, t0_ns: int) -> None:
        store = TraceStore(root, cfg.trace.max_bytes, cfg.model_dump(mode="json"), frames=False)
        self.recorder = Recorder(store, clock=clock, wall_offset_ns=time.time_ns() - t0_ns)
        self._batch: list[Any] = []

    def emit(self, msg: Any) -> None:
        self._batch.append(msg)

    def chunk(self, chunk: Chunk) -> None:
        self.recorder.sent(ChunkRows(chunk.ask_id, chunk.wep, chunk.step, Rows.of(chunk.rows)))

    def flush(self) -> None:
        for msg in self._batch:
            self.recorder.feed(msg)
        self._batch.clear()

    def close(self) -> Path | None:
        """Close the files (an episode still running ends ``daemon_stopped``); the run
        directory."""
        self.flush()
        self.recorder.store.close()
        return self.recorder.store.run_dir
