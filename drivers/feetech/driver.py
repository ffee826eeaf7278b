"""Feetech STS3215 arms (SO-100, SO-101) over the STS protocol.

At open, with torque off and the EEPROM unlocked (Lock 55 = 0), each servo gets robotd's
return delay, position mode and the calibration's homing offset (sign-magnitude, bit 11);
then the EEPROM is locked again. Direction (drive mode) is applied here, in software: the
STS3215 has no register for it that LeRobot calibrations use.
"""

from __future__ import annotations

from typing import ClassVar

import pydantic

from drivers.feetech import table as t
from drivers.feetech.codec import FeetechCodec
from drivers.servo.bus import ServoBus
from drivers.servo.calibration import Calibration
from drivers.servo.joints import ServoJoints
from drivers.servo.options import ServoOptions, fixed_rate, known_models

_EEPROM = (t.RETURN_DELAY_TIME, t.OPERATING_MODE + 1 - t.RETURN_DELAY_TIME)  # 7..33


def word(value: int, sign_bit: int | None = None) -> bytes:
    """A 2-byte little-endian register value, sign-magnitude when `sign_bit` is given."""
    raw = t.encode_sign_magnitude(value, sign_bit) if sign_bit is not None else value
    return (raw & 0xFFFF).to_bytes(2, "little")


class FeetechOptions(ServoOptions):
    @pydantic.field_validator("baud")
    @classmethod
    def _baud(cls, baud: int) -> int:
        return fixed_rate(baud, t.BAUD_RATES.values(), "an STS3215")

    @pydantic.field_validator("models")
    @classmethod
    def _models(cls, models: list[str]) -> list[str]:
        return known_models(models, t.MODELS.values(), "Feetech")


class FeetechJoints(ServoJoints):
    Options: ClassVar[type[ServoOptions]] = FeetechOptions
    protocol = "feetech"
    software_direction = True
    state_block = t.STATE_BLOCK
    goal_register = (t.GOAL_POSITION, 2)
    torque_register = t.TORQUE_ENABLE
    velocity_unit = t.VELOCITY_UNIT_RAD_S

    def codec(self) -> FeetechCodec:
        return FeetechCodec()

    def configure(self, bus: ServoBus, cal: Calibration) -> None:
        for name, ident in zip(self.names, self.ids):
            bus.write(ident, t.TORQUE_ENABLE, b"\x00")
            ee = bus.read(ident, *_EEPROM)
            wanted = {
                t.RETURN_DELAY_TIME: bytes((self.options.return_delay_us // 2,)),
                t.HOMING_OFFSET: word(cal.joints[name].homing_offset, 11),
                t.OPERATING_MODE: b"\x00",
            }
            changes = {
                a: v
                for a, v in wanted.items()
                if ee[a - t.RETURN_DELAY_TIME : a - t.RETURN_DELAY_TIME + len(v)] != v
            }
            if not changes:
                continue
            bus.write(ident, t.LOCK, b"\x00")
            for address, value in changes.items():
                bus.write(ident, address, value)
            bus.write(ident, t.LOCK, b"\x01")

    def model_of(self, bus: ServoBus, ident: int, ping: object) -> int:
        # an STS ping carries no model: it is register 3
        return int.from_bytes(bus.read(ident, t.MODEL_NUMBER, 2), "little")

    def decode_state(self, data: bytes) -> tuple[int, int, int]:
        position = t.decode_sign_magnitude(data[0] | data[1] << 8, 15)
        velocity = t.decode_sign_magnitude(data[2] | data[3] << 8, 15)
        load = t.decode_sign_magnitude(data[4] | data[5] << 8, 10)
        return position, velocity, load

    def encode_goal(self, ticks: int) -> bytes:
        return word(ticks, 15)

    def effort_unit(self, ident: int) -> float:
        return t.LOAD_UNIT
