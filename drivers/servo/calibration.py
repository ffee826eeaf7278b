"""Calibration of a servo arm: per joint its homing offset, drive mode and range, stored
in a JSON file next to the robot's config, and the conversion between ticks and SI units.

Ticks are the servo's Present/Goal Position, after the servo applied its homing offset
(written to the servo at open). A rotary joint's zero is the middle of its range:
q = sign · (ticks − mid) · 2π / resolution; a gripper reads 0..1 over its range
(0 at range_min). `sign` is −1 for drive mode 1 where the family applies the direction
in software (Feetech); Dynamixel servos reverse themselves (Drive Mode register).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pydantic

FORMAT = "robotd.servo-calibration/1"
MAX_TICKS = 1 << 20


class CalibrationError(ValueError):
    """A calibration file is missing, unreadable or does not fit the config."""


class JointCalibration(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    id: int = pydantic.Field(ge=0, le=252)
    homing_offset: int = pydantic.Field(ge=-MAX_TICKS, le=MAX_TICKS)
    drive_mode: Literal[0, 1] = 0
    range_min: int = pydantic.Field(ge=-MAX_TICKS, le=MAX_TICKS)
    range_max: int = pydantic.Field(ge=-MAX_TICKS, le=MAX_TICKS)

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> JointCalibration:
        if not self.range_min < self.range_max:
            raise ValueError(f"range_min {self.range_min} must be < range_max {self.range_max}")
        return self


class Calibration(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    format: Literal["robotd.servo-calibration/1"] = FORMAT
    protocol: Literal["dynamixel", "feetech"]
    resolution: int = pydantic.Field(4096, gt=1, le=MAX_TICKS)
    source: str = ""  # how it was made ("robotd calibrate", "lerobot import of ...")
    joints: dict[str, JointCalibration]


def load_calibration(path: Path) -> Calibration:
    """The calibration in `path`; CalibrationError naming the file and the key."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CalibrationError(f"{path}: no such calibration file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read: {exc}") from None
    try:
        return Calibration.model_validate_json(text)
    except pydantic.ValidationError as exc:
        from robotd.errors import validation_lines

        raise CalibrationError(f"{path}: " + "; ".join(validation_lines(exc))) from None


def save_calibration(cal: Calibration, path: Path) -> None:
    """Write atomically (a half-written calibration must never be read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(cal.model_dump(mode="json"), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def resolve_path(name: str, config_dir: Path | None) -> Path:
    """A calibration path from options: absolute as is, relative to the config's directory
    (the working directory when the runtime gave none)."""
    path = Path(name).expanduser()
    if path.is_absolute():
        return path
    return (config_dir if config_dir is not None else Path.cwd()) / path


class Converter:
    """Ticks ↔ SI for a set of joints, vectorised (numpy, float64)."""

    def __init__(
        self,
        cal: Calibration,
        names: Sequence[str],
        grippers: Sequence[str],
        *,
        software_direction: bool,
    ) -> None:
        missing = [n for n in names if n not in cal.joints]
        if missing:
            raise CalibrationError(f"no calibration for joints {missing}")
        rows = [cal.joints[n] for n in names]
        self.lo = np.array([r.range_min for r in rows], dtype=np.float64)
        self.hi = np.array([r.range_max for r in rows], dtype=np.float64)
        self.mid = (self.lo + self.hi) / 2
        flip = [software_direction and r.drive_mode == 1 for r in rows]
        self.sign = np.where(flip, -1.0, 1.0)
        self.gripper = np.array([n in set(grippers) for n in names])
        self.scale = 2 * math.pi / cal.resolution
        self.span = self.hi - self.lo

    def to_si(self, ticks: np.ndarray) -> np.ndarray:
        """Positions: rad for rotary joints, 0..1 for grippers (not clipped: a gripper
        pushed past its calibrated range reads outside 0..1)."""
        rad = self.sign * (ticks - self.mid) * self.scale
        frac = (ticks - self.lo) / self.span
        frac = np.where(self.sign < 0, 1.0 - frac, frac)
        return np.where(self.gripper, frac, rad)

    def to_ticks(self, si: np.ndarray) -> np.ndarray:
        """Goal ticks for SI targets, rounded and clipped to each joint's calibrated range."""
        rotary = self.mid + self.sign * si / self.scale
        frac = np.where(self.sign < 0, 1.0 - si, si)
        grip = self.lo + frac * self.span
        ticks = np.rint(np.where(self.gripper, grip, rotary))
        return np.clip(ticks, self.lo, self.hi).astype(np.int64)

    def velocity_to_si(self, raw: np.ndarray, unit_rad_s: float) -> np.ndarray:
        """Joint velocities: rad/s for rotary joints, range fractions a second for grippers."""
        rad = self.sign * raw * unit_rad_s
        return np.where(self.gripper, rad / (self.span * self.scale), rad)
