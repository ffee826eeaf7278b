"""Policies for the trace tests, served by a daemon's local worker (`policy.serve`)."""

from __future__ import annotations

from robotd.contract import Camera, Observations, Stream
from robotd.worker.demo import DotFollower

JPEG_TOP = Camera(width=160, height=120, codec="jpeg", quality=80)


class JpegDotFollower(DotFollower):
    """The demo policy reading the top camera fitted to 160x120 and sent as JPEG, so the
    uplink encodes JPEG (which the trace then keeps as it is)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.observations = Observations(
            streams={"top": Stream(at=[-3, 0], camera=JPEG_TOP), "joints.pos": Stream()}
        )
