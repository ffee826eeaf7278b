"""Import of the calibration files LeRobot writes for its so100/so101 and koch arms.

LeRobot (`lerobot-calibrate`) stores one JSON object per arm under
~/.cache/huggingface/lerobot/calibration/{robots,teleoperators}/<type>/<id>.json, keyed by
motor name, each value ``{"id", "drive_mode", "homing_offset", "range_min", "range_max"}``
in raw servo ticks: the homing offset is what it wrote to the servo's Homing Offset
register, the range is in the positions the servo reports after that offset. robotd's own
calibration holds the same numbers, so an arm calibrated there keeps its calibration.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pydantic

from drivers.servo.calibration import (
    MAX_TICKS,
    Calibration,
    CalibrationError,
    JointCalibration,
)

MAX_FILE_BYTES = 1 << 20


class LeRobotMotor(pydantic.BaseModel):
    # keys LeRobot may add later are ignored; the five it writes today are required
    model_config = pydantic.ConfigDict(extra="ignore", strict=True)

    id: int = pydantic.Field(ge=0, le=252)
    drive_mode: int = pydantic.Field(ge=0, le=255)
    homing_offset: int = pydantic.Field(ge=-MAX_TICKS, le=MAX_TICKS)
    range_min: int = pydantic.Field(ge=-MAX_TICKS, le=MAX_TICKS)
    range_max: int = pydantic.Field(ge=-MAX_TICKS, le=MAX_TICKS)


_FILE = pydantic.TypeAdapter(dict[str, LeRobotMotor])


def import_lerobot(
    path: Path,
    protocol: Literal["dynamixel", "feetech"],
    names: Sequence[str],
    mapping: dict[str, str] | None = None,
) -> Calibration:
    """robotd's calibration for joints `names` from LeRobot's file at `path`.

    mapping: robotd joint name → LeRobot motor name, where they differ (same name when
    absent). CalibrationError names the file and what is wrong with it.
    """
    mapping = mapping or {}
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise CalibrationError(f"{path}: larger than {MAX_FILE_BYTES} bytes, not a calibration")
        text = path.read_text()
    except FileNotFoundError:
        raise CalibrationError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read: {exc}") from None
    try:
        motors = _FILE.validate_json(text)
    except pydantic.ValidationError as exc:
        from robotd.errors import validation_lines

        raise CalibrationError(
            f"{path}: not a LeRobot calibration: " + "; ".join(validation_lines(exc)[:5])
        ) from None
    joints = {}
    for name in names:
        motor = mapping.get(name, name)
        m = motors.get(motor)
        if m is None:
            raise CalibrationError(
                f"{path}: no motor {motor!r} for joint {name!r} (the file has {sorted(motors)})"
            )
        try:
            joints[name] = JointCalibration(
                id=m.id,
                homing_offset=m.homing_offset,
                drive_mode=1 if m.drive_mode & 1 else 0,
                range_min=m.range_min,
                range_max=m.range_max,
            )
        except pydantic.ValidationError as exc:
            raise CalibrationError(f"{path}: motor {motor!r}: {exc.errors()[0]['msg']}") from None
    ids = [j.id for j in joints.values()]
    if len(set(ids)) != len(ids):
        raise CalibrationError(f"{path}: two joints share a servo ID: {ids}")
    return Calibration(protocol=protocol, joints=joints, source=f"LeRobot calibration {path}")
