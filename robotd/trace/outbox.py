"""The bounded queue between the event loop and the trace's writer thread.

The producer side takes no lock and never waits: an append to a deque (atomic under the
GIL) after a length and byte check. Each counter has one writer: the producer counts what
it put in and what it dropped, the writer thread what it took out, so neither side
needs a lock to read the other's.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class Outbox:
    """Items for the writer thread: data items bounded by count and bytes, control items never
    dropped (there are few: episode begin/end, close)."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self._q: deque[tuple[Any, ...]] = deque()
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.wake = threading.Event()
        self.bytes_in = 0  # producer: frame bytes put in
        self.bytes_out = 0  # writer thread: frame bytes taken out
        self.dropped_records = 0  # producer
        self.dropped_frames = 0  # producer
        # per control item queued, in order: (dropped_records, dropped_frames) when it was
        self.control_marks: deque[tuple[int, int]] = deque()
        self._half = max(1, max_items // 2)

    def put(self, item: tuple[Any, ...]) -> bool:
        """Queue a record; False (and counted) when the queue is full."""
        n = len(self._q)
        if n >= self.max_items:
            self.dropped_records += 1
            return False
        self._q.append(item)
        if n >= self._half and not self.wake.is_set():
            self.wake.set()  # filling up: don't wait for the writer's next poll
        return True

    def put_frame(self, item: tuple[Any, ...], nbytes: int) -> bool:
        """Queue a frame of `nbytes`; False (and counted) when count or bytes are over."""
        queued = self.bytes_in - self.bytes_out
        if len(self._q) >= self.max_items or queued + nbytes > self.max_bytes:
            self.dropped_frames += 1
            return False
        self.bytes_in += nbytes
        self._q.append(item)
        return True

    def take_frame_room(self, nbytes: int) -> bool:
        """Whether a frame of `nbytes` would be queued now; when not, it is counted as
        dropped here (the caller then need not copy it out of its ring at all)."""
        queued = self.bytes_in - self.bytes_out
        if len(self._q) >= self.max_items or queued + nbytes > self.max_bytes:
            self.dropped_frames += 1
            return False
        return True

    def put_control(self, item: tuple[Any, ...]) -> None:
        # the drops counted so far came before this item: the writer files them under
        # the file open before it (an episode's begin), not under the one it opens
        self.control_marks.append((self.dropped_records, self.dropped_frames))
        self._q.append(item)
        self.wake.set()

    def take(self) -> tuple[Any, ...] | None:
        try:
            return self._q.popleft()
        except IndexError:
            return None

    def __len__(self) -> int:
        return len(self._q)
