"""Decoding uploaded frames in the worker's main process, for the copies of the policy.

Frames are decoded once, ahead of the acts that read them, on a decoder thread (bounded by a
DecodeBudget and a queue of MAX_AHEAD frames); `decode_window` hands an act's window over
decoded, decoding for itself what was not done ahead (and naming the step and key of a
frame that does not decode).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from robotd.frames import FrameError, decode
from robotd.worker.frame import DecodeBudget, Frame
from robotd.worker.policy_host import PolicyCallError

MAX_AHEAD = 256  # frames waiting to be decoded ahead; beyond it the act's preparer decodes


def decode_window(
    layouts: Mapping[str, str], steps: list[int], observations: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The observations with every uploaded frame (robotd.worker.frame.Frame) decoded to its
    key's layout; a bad frame is PolicyCallError("bad_frame") naming step and key."""
    out = []
    for step, obs in zip(steps, observations):
        if any(isinstance(v, Frame) for v in obs.values()):
            obs = {
                k: _decode(layouts, step, k, v) if isinstance(v, Frame) else v
                for k, v in obs.items()
            }
        out.append(obs)
    return out


def decoded_window(observations: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The observations with every uploaded frame replaced by its copy decoded ahead, or None
    if one has none yet (then decode_window must be called, off the poll loop)."""
    out = []
    for obs in observations:
        if any(isinstance(v, Frame) for v in obs.values()):
            obs = {k: v.decoded() if isinstance(v, Frame) else v for k, v in obs.items()}
            if any(v is None for v in obs.values()):
                return None
        out.append(obs)
    return out


def _decode(layouts: Mapping[str, str], step: int, key: str, frame: Frame) -> np.ndarray:
    layout = layouts.get(key, "hwc_uint8")
    try:
        return frame.value(lambda msg: decode(msg, layout, name=key))
    except FrameError as err:
        raise PolicyCallError("bad_frame", f"step {step} key {key!r}: {err}") from None


class Decoder:
    """Decodes uploaded frames ahead of the acts that read them, on a thread of its own, so
    that what an act reads is decoded when it is handed to a copy (Frame.ahead). Bounded by
    the budget's bytes and a queue of MAX_AHEAD frames: a frame left out is decoded when read,
    as are frames that fail to decode (the error is the act's). `submit` is called from the
    worker's poll loop and never blocks."""

    def __init__(self, layouts: Mapping[str, str], budget: DecodeBudget) -> None:
        self.layouts = dict(layouts)
        self.budget = budget
        self._queue: queue.Queue[tuple[str, Frame] | None] = queue.Queue(MAX_AHEAD)
        self._thread = threading.Thread(target=self._run, name="robotd-decode", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, key: str, frame: Frame) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait((key, frame))

    def stop(self) -> None:
        """Drop what waits and end the thread (call from the thread that submits)."""
        if not self._thread.is_alive():
            return
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            key, frame = item
            layout = self.layouts.get(key, "hwc_uint8")
            frame.ahead(
                lambda msg, k=key, lay=layout: decode(msg, lay, name=k),
                self.budget,
                decoded_size(frame.msg, layout),
            )


def decoded_size(msg: Any, layout: str) -> int:
    """Bytes a frame message decodes to, from its declared shape (0 if it has none: then it
    does not decode either)."""
    shape = msg.get("shape") if isinstance(msg, dict) else None
    if not isinstance(shape, list | tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        return 0
    return int(np.prod(shape, dtype=np.int64)) * (4 if layout == "chw_float" else 1)
