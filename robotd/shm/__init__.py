"""Shared memory between robotd's processes: segments (segment.py) and the frame ring."""

from robotd.shm.ring import MAX_SLOTS, FrameRing, ring_bytes, ring_slots
from robotd.shm.segment import (
    SHM_DIR,
    ShmError,
    attach_segment,
    create_segment,
    release_mmap,
    round_up,
    unlink_prefix,
    unlink_segment,
)

__all__ = [
    "MAX_SLOTS",
    "SHM_DIR",
    "FrameRing",
    "ShmError",
    "attach_segment",
    "create_segment",
    "release_mmap",
    "ring_bytes",
    "ring_slots",
    "round_up",
    "unlink_prefix",
    "unlink_segment",
]
