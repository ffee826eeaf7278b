"""Driver interfaces: what the control lane and the camera processes rely on.

A joint driver is read and written once per control tick from the control
process's loop thread; a camera runs in a process of its own and writes frames
into a shared-memory ring (robotd.shm.FrameRing). Both raise DriverFault for
anything that must stop motion; the caller holds and latches FAULT.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class DriverFault(Exception):
    """A driver can no longer be trusted: the control lane holds and latches FAULT.

    `joint` names the joint (or camera) at fault where one is known.
    """

    def __init__(self, message: str, *, joint: str | None = None) -> None:
        super().__init__(message)
        self.joint = joint


@dataclass(slots=True)
class JointState:
    """One read of every joint, in the driver's joint order (SI units, float64)."""

    position: np.ndarray
    velocity: np.ndarray
    effort: np.ndarray
    read_time_ns: int  # time.monotonic_ns() (or the virtual clock) when the read completed


@dataclass(slots=True)
class DriverStats:
    """Per-joint counters of transport trouble, reported in the tick statistics."""

    retries: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)


class JointDriver(ABC):
    """A set of joints read and commanded together, once per control tick.

    Contract:
    - `open()` connects and leaves torque as configured to start (off unless the
      config says otherwise); it raises DriverFault if the hardware is absent.
    - `read()` returns the state of every joint; it retries transport errors
      within its own budget and raises DriverFault after a run of failures.
    - `write(targets)` commands one target per joint (same order as `names`);
      it must not block for longer than a small fraction of a tick.
    - `torque(on)` enables or disables holding torque on every joint.
    - `close()` is idempotent and never raises.
    """

    names: tuple[str, ...]

    @abstractmethod
    def open(self) -> None: ...

    @abstractmethod
    def read(self) -> JointState: ...

    @abstractmethod
    def write(self, targets: np.ndarray) -> None: ...

    @abstractmethod
    def torque(self, on: bool) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def stats(self) -> DriverStats:
        """Transport counters; drivers without a transport report none."""
        return DriverStats()

    def ground_truth(self) -> dict[str, float]:
        """Simulated robots report task metrics (e.g. tracking_error); real ones nothing."""
        return {}


class Camera(ABC):
    """A camera that captures frames into a shared-memory ring, in its own process.

    Contract:
    - `open()` starts the device and raises DriverFault if it cannot.
    - `shape` is (height, width, 3) uint8 RGB of every frame it will write.
    - `capture(ring)` blocks until the next frame, writes it into the ring with
      its capture time (monotonic ns) and returns the frame index the ring gave
      it. A bad frame is counted and skipped, not written; DriverFault after a
      run of failures.
    - `close()` is idempotent and never raises.
    """

    shape: tuple[int, int, int]
    fps: float

    @abstractmethod
    def open(self) -> None: ...

    @abstractmethod
    def capture(self, ring: Any) -> int: ...

    @abstractmethod
    def close(self) -> None: ...
