"""Helpers for the servo tests: a calibration for an emulated arm, a driver on an emulator,
and a raw pty to catch the bytes a client writes."""

from __future__ import annotations

import os
import select
import time
import tty
from pathlib import Path

from drivers.base import DriverContext, JointDriver, build_joints
from drivers.servo.calibration import Calibration, JointCalibration, save_calibration

NAMES = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
IDS = (1, 2, 3, 4, 5, 6)


def write_calibration(
    path: Path, protocol: str, names=NAMES, ids=IDS, half_range: int = 1024, offsets=None
) -> Path:
    """Every joint centred on 2048 (0 rad) with ±half_range ticks of range."""
    offsets = offsets or {}
    cal = Calibration(
        protocol=protocol,
        joints={
            n: JointCalibration(
                id=i,
                homing_offset=offsets.get(n, 0),
                range_min=2048 - half_range,
                range_max=2048 + half_range,
            )
            for n, i in zip(names, ids)
        },
    )
    save_calibration(cal, path)
    return path


def make_driver(
    protocol: str, port: str, calibration: Path, warnings: list[str] | None = None, **options
) -> JointDriver:
    names = options.pop("names", NAMES)
    opts = {
        "port": port,
        "ids": list(options.pop("ids", IDS)),
        "calibration": str(calibration),
        "grippers": ["gripper"],
        # the in-process emulator shares our GIL: a generous slack keeps timing out of tests
        "timeout_ms": 50.0,
        "budget_ms": 400.0,
        **options,
    }
    sink = warnings if warnings is not None else []
    return build_joints(protocol, names, opts, DriverContext(warn=sink.append))


class RawPty:
    """A pty whose far side the test reads: what a client (an SDK) writes, byte for byte."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        self.path = os.ttyname(self.slave)

    def take(self, n: int, timeout: float = 5.0) -> bytes:
        out = b""
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select((self.master,), (), (), left)[0]:
                break
            out += os.read(self.master, n - len(out))
        return out

    def close(self) -> None:
        for fd in (self.master, self.slave):
            os.close(fd)
