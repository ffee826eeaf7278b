"""The codec between the worker's main process and its copies of the policy (never pickle):
robotd's framed messages (robotd.framed), the same as on the act connection.

A message is a list of ZeroMQ frames: the first is the msgpack header; every numpy array of
at least MIN_OUT_OF_BAND bytes travels as a frame of its own, its raw C-order bytes. Sent
with ZeroMQ's zero-copy, an array goes from the main process's memory to the socket without
a copy in Python (an array the worker received as a frame goes on as that same frame), and
comes out in the copy as a read-only array over the received frame (np.frombuffer, no copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from robotd import framed

MIN_OUT_OF_BAND = framed.MIN_OUT_OF_BAND
Buffer = framed.Buffer


def pack(obj: Any) -> list[Buffer]:
    """`obj` as frames: [msgpack, raw array bytes, ...]; WireError if not representable."""
    return framed.pack(obj)


def unpack(frames: Sequence[Buffer]) -> Any:
    """The object `pack` made (out-of-band arrays as read-only views of their frames);
    WireError naming what is wrong."""
    return framed.unpack(frames)
