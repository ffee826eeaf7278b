"""Dynamixel X-series arms (Koch, ALOHA: XL330, XL430, XM430) over Protocol 2.0.

At open, with torque off, each servo is put in the state robotd drives it in: operating
mode, return delay, drive mode (direction) and homing offset from the calibration, its Bus
Watchdog cleared. Once torque is on the Bus Watchdog (98) is armed, so that a servo that
hears nothing for `watchdog_ms` stops by itself: if the daemon dies, the arm stops; one
that stopped while the daemon lives is re-armed (drivers.dynamixel.watchdog).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import ClassVar, Literal

import pydantic

from drivers.base import DriverContext, JointState, exact_kind
from drivers.dynamixel import table as t
from drivers.dynamixel.codec import DynamixelCodec
from drivers.dynamixel.watchdog import BusWatchdog
from drivers.servo.bus import Reply, ServoBus
from drivers.servo.calibration import Calibration
from drivers.servo.joints import ServoJoints
from drivers.servo.options import ServoOptions, fixed_rate, known_models

_EEPROM = (t.FIRMWARE_VERSION, t.HOMING_OFFSET + 4 - t.FIRMWARE_VERSION)  # 6..23


class DynamixelOptions(ServoOptions):
    # 3: position, 4: extended position, 5: current-based position (XL330/XM430 grippers)
    operating_mode: Literal[3, 4, 5] = 3
    gripper_operating_mode: Literal[3, 4, 5] | None = None  # None: operating_mode
    watchdog_ms: int = pydantic.Field(100, ge=0, le=2540)  # 0: off; 20 ms steps
    fast_sync_read: Literal["auto", "on", "off"] = "auto"

    @pydantic.field_validator("baud")
    @classmethod
    def _baud(cls, baud: int) -> int:
        return fixed_rate(baud, t.BAUD_RATES.values(), "an X-series Dynamixel")

    @pydantic.field_validator("models")
    @classmethod
    def _models(cls, models: list[str]) -> list[str]:
        return known_models(models, t.MODEL_BY_NAME, "Dynamixel")

    @pydantic.field_validator("operating_mode", "gripper_operating_mode", mode="before")
    @classmethod
    def _mode(cls, value: object) -> object:
        # a Literal of integers takes 3.0 for 3, even strictly: a float is no mode number
        return exact_kind(value, (int, type(None)), "an integer (3, 4 or 5)")


class DynamixelJoints(ServoJoints):
    Options: ClassVar[type[ServoOptions]] = DynamixelOptions
    options: DynamixelOptions
    protocol = "dynamixel"
    software_direction = False  # Drive Mode bit 0 reverses the servo itself
    state_block = t.STATE_BLOCK
    goal_register = (t.GOAL_POSITION, 4)
    torque_register = t.TORQUE_ENABLE
    velocity_unit = t.VELOCITY_UNIT_RAD_S

    def __init__(self, names: Sequence[str], options: ServoOptions, context: DriverContext) -> None:
        super().__init__(names, options, context)
        self.watchdog = BusWatchdog(
            self.ids,
            self.names,
            [self._stats.joints[n] for n in self.names],
            self.options.watchdog_ms // t.WATCHDOG_UNIT_MS,
            context.warn,
        )

    def read(self) -> JointState:
        state = super().read()
        self.watchdog.heard(self._bus())
        return state

    def codec(self) -> DynamixelCodec:
        return DynamixelCodec()

    def configure(self, bus: ServoBus, cal: Calibration) -> None:
        o = self.options
        self.firmware: dict[int, int] = {}
        for name, ident in zip(self.names, self.ids):
            bus.write(ident, t.TORQUE_ENABLE, b"\x00")
            bus.write(ident, t.BUS_WATCHDOG, b"\x00")  # clears a tripped watchdog too
            ee = bus.read(ident, *_EEPROM)
            self.firmware[ident] = ee[0]
            j = cal.joints[name]
            mode = o.operating_mode
            if name in o.grippers and o.gripper_operating_mode is not None:
                mode = o.gripper_operating_mode
            wanted = {
                t.RETURN_DELAY_TIME: bytes((o.return_delay_us // 2,)),
                t.DRIVE_MODE: bytes(((ee[t.DRIVE_MODE - 6] & ~1) | j.drive_mode,)),
                t.OPERATING_MODE: bytes((mode,)),
                t.HOMING_OFFSET: struct.pack("<i", j.homing_offset),
            }
            for address, value in wanted.items():
                at = address - t.FIRMWARE_VERSION
                if ee[at : at + len(value)] != value:  # EEPROM: write only what differs
                    bus.write(ident, address, value)

    def use_fast_read(self) -> bool:
        mode = self.options.fast_sync_read
        if mode != "auto":
            return mode == "on"
        return all(
            (m := t.MODELS.get(self.models.get(i, 0))) is not None
            and m.fast_sync_read
            and self.firmware.get(i, 0) >= t.FAST_SYNC_READ_FIRMWARE
            for i in self.ids
        )

    def decode_state(self, data: bytes) -> tuple[int, int, int]:
        current, velocity, position = struct.unpack_from("<hii", data)
        return position, velocity, current

    def encode_goal(self, ticks: int) -> bytes:
        return struct.pack("<i", ticks)

    def effort_unit(self, ident: int) -> float:
        model = t.MODELS.get(self.models.get(ident, 0))
        return model.effort_unit if model is not None else 1.0

    def condition(self, bus: ServoBus, reply: Reply) -> str:
        text = bus.codec.describe_error(reply.error)
        if reply.error & 0x80:
            value = bus.read(reply.ident, t.HARDWARE_ERROR_STATUS, 1)[0]
            names = t.hardware_error_names(value) or ["none reported"]
            text = f"hardware error: {', '.join(names)} (Hardware Error Status {value:#04x})"
        return text

    def after_torque(self, bus: ServoBus, on: bool) -> None:
        if on:
            self.watchdog.arm(bus)
        else:
            self.watchdog.disarm(bus)
