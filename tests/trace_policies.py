"""Policies for the trace tests, served by a daemon's local worker (`policy.serve`)."""

from __future__ import annotations

from typing import Any

from robotd.contract import Observations, Stream
from robotd.worker.demo import DotFollower


class RawDotFollower(DotFollower):
    """The demo policy reading the top camera as captured (no camera spec: raw frames go
    up, so the trace encodes its own JPEG of them)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"colour_tolerance": 0, **kwargs})
        self.observations = Observations(streams={"top": Stream(at=[-3, 0]),
                                                  "joints.pos": Stream()})
