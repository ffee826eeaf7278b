"""A frame the worker holds: encoded as it travelled, decoded at most once ahead of its acts.

The frame store (robotd.worker.store) keeps Frames; the decoder thread decodes them ahead
within a DecodeBudget (robotd.worker.decoding); the policy thread reads them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class DecodeBudget:
    """Bytes of frames decoded ahead of their acts, held at most `limit` (thread-safe)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        with self._lock:
            if self.held + nbytes > self.limit:
                return False
            self.held += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes


class Frame:
    """An encoded camera frame as it travelled (robotd.frames.to_wire).

    Decoded at most once ahead of the acts that read it, on the worker's decoder thread
    (`ahead`, within a DecodeBudget given back when the frame is gone), read-only; the
    policy thread takes that copy, waiting if it is being made, or decodes for itself
    (`value`). `released`: the store let go of it (an act may still be reading it), so it
    is not worth decoding ahead any more.
    """

    __slots__ = ("_budget", "_charged", "_lock", "_value", "msg", "released")

    def __init__(self, msg: Any) -> None:
        self.msg = msg
        self.released = False
        self._lock = threading.Lock()
        self._value: Any = None
        self._budget: DecodeBudget | None = None
        self._charged = 0

    def ahead(self, decode: Callable[[Any], Any], budget: DecodeBudget, nbytes: int) -> bool:
        """Decode now and keep the result if `nbytes` fit the budget; False if not done
        (released, done already, no room, or it does not decode: `value` will say why)."""
        with self._lock:
            if self.released or self._value is not None or not budget.take(nbytes):
                return False
            try:
                value = decode(self.msg)
            except Exception:
                budget.give(nbytes)
                return False
            if hasattr(value, "flags"):
                value.flags.writeable = False  # shared by every act that reads the frame
            self._value, self._budget, self._charged = value, budget, nbytes
            return True

    def decoded(self) -> Any:
        """The copy decoded ahead, or None if none (yet); never waits (set whole, once)."""
        return self._value

    def value(self, decode: Callable[[Any], Any]) -> Any:
        """The decoded frame: the copy made ahead, else `decode(msg)` (not kept)."""
        with self._lock:
            value = self._value
        return value if value is not None else decode(self.msg)

    def __del__(self) -> None:
        budget = getattr(self, "_budget", None)
        if budget is not None:
            budget.give(self._charged)
