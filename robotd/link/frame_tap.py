"""The frames an inline window carries, told to the trace.

A window that goes up inline (the native link without an observe connection, every act to
an openpi server) is read out of the camera rings at its act; those are the frames the
policy reads, so the trace records them as it records uploaded ones (robotd.runtime.recorder).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from robotd.link.windows import Window

log = logging.getLogger("robotd.link")


class FrameTap(Protocol):
    """Told the camera frames an inline act read. Called on the event loop; must return at
    once and must not change the arrays (the act sends them); it may keep them, since
    nothing changes them after (they are copies out of the rings)."""

    def inlined(self, wep: str, step: int, frames: Mapping[str, np.ndarray]) -> None:
        """Step `step`'s frames (HWC uint8, as read out of the rings) went inline."""
        ...


def tap_window(tap: FrameTap | None, wep: str, window: Window, inputs: Mapping[str, Any]) -> None:
    """Hand `tap` each step's camera frames of an assembled inline window (robotd.link.
    windows.assemble): its HWC uint8 arrays. A tap that fails is logged, never raised."""
    if tap is None:
        return
    seen: set[int] = set()
    try:
        for s, obs in zip(window.steps, inputs["observations"], strict=True):
            step = window.source_step(s)
            frames = {
                key: value
                for key, value in obs.items()
                if isinstance(value, np.ndarray) and value.ndim == 3 and value.dtype == np.uint8
            }
            if frames and step not in seen:
                seen.add(step)
                tap.inlined(wep, step, frames)
    except Exception:  # the trace must never fail an act
        log.exception("the inline frame tap failed")
