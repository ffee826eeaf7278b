"""One control tick, the same for the wall clock and the virtual clock (ros2_control's
read → update → write): read the joints → take each camera's newest frame reference →
kernel.update → switch torque if the kernel changed it → write the target, guarded.

Any exception from a driver (not only DriverFault: a serial OSError, a bug in a plugin)
is a failed operation this tick, reported through `on_error`, never the end of the loop;
an exception from the kernel holds the last approved target.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np

from drivers.base import JointDriver
from robotd.control.kernel import Kernel
from robotd.lane.messages import FrameRef

FrameRefs = Callable[[], Mapping[str, FrameRef | None]]
OnError = Callable[[str, BaseException], None]


class TickIO:
    """Binds a kernel to its joint driver and frame references; `run` is one tick.

    `frames()` returns each camera's newest frame reference (the control lane reads the
    rings' index; the virtual rig its own captures). `on_error(op, exc)` hears every failed
    driver operation ("read", "ground_truth", "torque", "write") and kernel error ("kernel").
    `written` is the target written by the last tick (None when nothing was); `done_ns`
    when its writes (torque and target) were done or tried, on the kernel's clock; `failed`
    the error of the one that raised ("torque: OSError: ..."), None when every write the
    tick owed went out: an e-stop is acknowledged as written only then.
    """

    def __init__(
        self,
        kernel: Kernel,
        driver: JointDriver,
        frames: FrameRefs,
        on_error: OnError,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.kernel = kernel
        self.clock = clock
        self.driver = driver
        self.frames = frames
        self.on_error = on_error
        self.torque = kernel.torque_on
        self.has_truth = False
        self.written: np.ndarray | None = None
        self.done_ns = 0
        self.failed: str | None = None

    def start(self) -> None:
        """Before the first tick: hold where the joints are (the driver anchors its target
        on torque on) and find out whether the driver reports ground truth."""
        self.driver.torque(self.kernel.torque_on)
        self.torque = self.kernel.torque_on
        self.has_truth = bool(self.driver.ground_truth())

    def safe_now(self) -> int:
        """Between ticks (an e-stop that cannot wait for the next one): switch torque if the
        kernel changed it, else write the last approved target again; returns when done
        (or tried: `failed` says which)."""
        kernel, driver = self.kernel, self.driver
        self.failed = None
        op = "torque"
        try:
            if kernel.torque_on != self.torque:
                driver.torque(kernel.torque_on)
                self.torque = kernel.torque_on
            elif kernel.torque_on and kernel.shield.last is not None:
                op = "write"
                driver.write(kernel.shield.last)
        except Exception as exc:
            self.failed = _said(op, exc)
            self.on_error("estop", exc)
        self.done_ns = self.clock()
        return self.done_ns

    def run(self, now_ns: int, skipped: int = 0) -> np.ndarray | None:
        """One tick at `now_ns`, `skipped` deadlines after the previous one; the target
        written (None when nothing was)."""
        kernel, driver = self.kernel, self.driver
        try:
            joints = driver.read()
        except Exception as exc:
            joints = None
            self.on_error("read", exc)
        frames = self.frames()
        truth = None
        if self.has_truth and joints is not None:
            try:
                truth = driver.ground_truth()
            except Exception as exc:
                self.on_error("ground_truth", exc)
        try:
            target = kernel.update(now_ns, joints, frames, truth, skipped)
        except Exception as exc:  # a kernel bug: hold the last approved target, say so
            target = kernel.shield.last if kernel.torque_on else None
            self.on_error("kernel", exc)
        self.failed = None
        if kernel.torque_on != self.torque:
            try:
                driver.torque(kernel.torque_on)
                self.torque = kernel.torque_on
            except Exception as exc:
                self.failed = _said("torque", exc)
                self.on_error("torque", exc)
        self.written = None
        if target is not None:
            try:
                driver.write(target)
                self.written = target
            except Exception as exc:
                self.failed = self.failed or _said("write", exc)
                self.on_error("write", exc)
        self.done_ns = self.clock()
        return self.written


def _said(op: str, exc: BaseException) -> str:
    """A failed write in one bounded line: 'torque: OSError: [Errno 5] ...'."""
    return f"{op}: {type(exc).__name__}: {exc}"[:300]
