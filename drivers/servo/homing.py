"""What calibrating an arm needs of its bus, without a calibration: torque off, raw
positions, and homing offsets written so that the middle pose reads a half turn (2047).

Homing offset semantics differ by family: a Dynamixel reports Present = actual + offset,
a Feetech Present = actual − offset. `half_turn_offset` gives the offset that puts a
position read with offset 0 at 2047 on either.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from drivers.dynamixel import table as dxt
from drivers.dynamixel.codec import DynamixelCodec
from drivers.feetech import table as ftt
from drivers.feetech.codec import FeetechCodec
from drivers.servo.bus import Codec, ServoBus
from drivers.servo.transport import SerialTransport

HALF_TURN = 2047


def decode_register(data: bytes, sign_bit: int | None) -> int:
    """A signed register's value: 4 bytes two's complement (sign_bit None: Dynamixel),
    else 2 bytes sign-magnitude with the sign at `sign_bit` (Feetech)."""
    if sign_bit is None:
        return int(struct.unpack("<i", data[:4])[0])
    return ftt.decode_sign_magnitude(int.from_bytes(data[:2], "little"), sign_bit)


@dataclass(frozen=True)
class Family:
    codec: type[Codec]
    torque: int
    present: int  # Present Position address (2 or 4 bytes)
    present_size: int
    sign_bit: int | None  # sign-magnitude bit of Present Position; None: two's complement
    homing: int
    drive_mode: int | None  # Drive Mode register (bit 0: reverse), where the servo has one
    offset_sign: int  # Present = actual + offset_sign · offset
    model: int  # Model Number register (2 bytes)
    model_names: dict[int, str]  # model number → name, the models the driver knows


FAMILIES = {
    "dynamixel": Family(DynamixelCodec, dxt.TORQUE_ENABLE, dxt.PRESENT_POSITION, 4, None,
                        dxt.HOMING_OFFSET, dxt.DRIVE_MODE, +1, dxt.MODEL_NUMBER,
                        dxt.MODEL_NAMES),
    "feetech": Family(FeetechCodec, ftt.TORQUE_ENABLE, ftt.PRESENT_POSITION, 2, 15,
                      ftt.HOMING_OFFSET, None, -1, ftt.MODEL_NUMBER, ftt.MODELS),
}  # fmt: skip


def model_name(family: Family, number: int) -> str:
    """A model number by the name the family's table gives it, "model number N" else."""
    return family.model_names.get(number, f"model number {number}")


class HomingBus:
    """One arm's bus for calibration: see the module docstring."""

    def __init__(
        self, protocol: str, port: str, baud: int, warn: Callable[[str], None] = lambda m: None
    ) -> None:
        self.protocol = protocol
        self.family = FAMILIES[protocol]
        self.transport = SerialTransport(port, baud, warn=warn)
        self.bus: ServoBus | None = None

    def open(self) -> ServoBus:
        self.transport.open()
        self.bus = ServoBus(
            self.family.codec(), self.transport, slack_s=0.02, return_delay_s=0.0005
        )
        return self.bus

    def close(self) -> None:
        self.transport.close()

    def _bus(self) -> ServoBus:
        if self.bus is None:
            raise RuntimeError("the bus is not open")
        return self.bus

    def model_names(self, ids: Sequence[int]) -> dict[int, str]:
        """Each servo's model by name (read, nothing written): "model number N" for one the
        driver does not know."""
        f, bus = self.family, self._bus()
        numbers = {i: int.from_bytes(bus.read(i, f.model, 2), "little") for i in ids}
        return {i: model_name(f, n) for i, n in numbers.items()}

    def torque_off(self, ids: Sequence[int]) -> None:
        for i in ids:
            self._bus().write(i, self.family.torque, b"\x00")

    def positions(self, ids: Sequence[int], tries: int = 5) -> dict[int, int]:
        """Present Position of each servo (a sync read, the missing ones asked again);
        RuntimeError naming the servos that did not answer."""
        f, bus = self.family, self._bus()
        got: dict[int, int] = {}
        missing = list(ids)
        for _ in range(tries):
            out = bus.sync_read(f.present, f.present_size, missing)
            got.update({i: self._decode(r.data) for i, r in out.replies.items()})
            missing = [i for i in missing if i not in got]
            if not missing:
                return {i: got[i] for i in ids}
        raise RuntimeError(f"servos {missing} did not answer a position read ({tries} tries)")

    def _decode(self, data: bytes) -> int:
        return decode_register(data, self.family.sign_bit)

    def drive_modes(self, ids: Sequence[int]) -> dict[int, int]:
        f = self.family
        if f.drive_mode is None:
            return dict.fromkeys(ids, 0)
        return {i: self._bus().read(i, f.drive_mode, 1)[0] & 1 for i in ids}

    def set_homing_offset(self, ident: int, offset: int) -> None:
        bus = self._bus()
        if self.protocol == "dynamixel":
            bus.write(ident, dxt.HOMING_OFFSET, struct.pack("<i", offset))
            return
        raw = ftt.encode_sign_magnitude(offset, 11).to_bytes(2, "little")
        bus.write(ident, ftt.LOCK, b"\x00")
        bus.write(ident, ftt.HOMING_OFFSET, raw)
        bus.write(ident, ftt.LOCK, b"\x01")

    def half_turn_offset(self, present_with_zero_offset: int) -> int:
        """The offset that makes this position read HALF_TURN."""
        return self.family.offset_sign * (HALF_TURN - present_with_zero_offset)
