"""Emulated Feetech STS3215 servos speaking the STS protocol.

Present Position = shaft − Homing Offset (sign-magnitude, bit 11); goal, present position
and velocity are sign-magnitude with bit 15; EEPROM (below 40) takes writes only while Lock
(55) is 0; the `error` fault sets the overload bit in every status.
"""

from __future__ import annotations

from drivers.emulators.device import Device, Faults, Out, status_bytes
from drivers.emulators.servo import EmulatedServo
from drivers.feetech import packet as p
from drivers.feetech import table as t
from drivers.servo.frames import Frame

EEPROM_END = 40
OVERLOAD = 0x20


def _sm(value: float, bit: int) -> int:
    limit = (1 << bit) - 1
    return t.encode_sign_magnitude(max(-limit, min(limit, round(value))), bit)


class FeetechServo(EmulatedServo):
    torque_address = t.TORQUE_ENABLE
    goal_address = t.GOAL_POSITION
    return_delay_address = t.RETURN_DELAY_TIME

    def defaults(self) -> None:
        self.table[t.FIRMWARE_MAJOR] = 3
        self.table[t.FIRMWARE_MINOR] = 10
        self.put(t.MODEL_NUMBER, self.model, 2)
        self.table[t.ID] = self.ident
        self.put(t.MAX_POSITION_LIMIT, 4095, 2)
        self.put(t.TORQUE_LIMIT, 1000, 2)
        self.table[t.LOCK] = 1
        self.put(t.GOAL_POSITION, _sm(self.present(), 15), 2)

    def _offset(self) -> int:
        return t.decode_sign_magnitude(self.get(t.HOMING_OFFSET, 2), 11)

    def present(self) -> float:
        return self.actual - self._offset()

    def shaft(self, present: float) -> float:
        return present + self._offset()

    def goal(self) -> int:
        return t.decode_sign_magnitude(self.get(t.GOAL_POSITION, 2), 15)

    def store_present(self) -> None:
        load = 0.5 * (self.target - self.actual) if self.torque else 0
        self.put(t.PRESENT_POSITION, _sm(self.present(), 15), 2)
        self.put(t.PRESENT_VELOCITY, _sm(self.velocity, 15), 2)
        self.put(t.PRESENT_LOAD, _sm(load, 10), 2)
        self.table[t.MOVING] = 1 if abs(self.velocity) > 1 else 0

    def writable(self, address: int, length: int) -> bool:
        return address >= EEPROM_END or self.table[t.LOCK] == 0 or address == t.LOCK

    def written(self, address: int, length: int, now: float) -> None:
        if address <= t.TORQUE_ENABLE < address + length and self.torque:
            self.target = self.shaft(self.goal())
        if address <= t.HOMING_OFFSET < address + length:
            self.put(t.GOAL_POSITION, _sm(self.present(), 15), 2)
            self.target = self.actual
        super().written(address, length, now)


class FeetechDevice(Device):
    def parser(self) -> p.PacketParser:
        return p.PacketParser()

    def handle(self, frame: Frame, now: float, faults: Faults) -> list[Out]:
        inst, params = frame.head, frame.params
        if frame.ident == p.BROADCAST:
            if inst == p.SYNC_READ and len(params) >= 2:
                ids = [i for i in params[2:] if i in self.servos]
                return [o for i in ids if (o := self._read(i, params[0], params[1], now, faults))]
            if inst == p.SYNC_WRITE and len(params) >= 2:
                self._sync_write(params[0], params[1], params[2:], now)
            elif inst == p.WRITE and len(params) >= 2:
                for s in self.servos.values():
                    s.write(params[0], params[1:], now)
            elif inst == p.PING:
                return [o for i in sorted(self.servos) if (o := self._status(i, b"", faults))]
            return []
        if frame.ident not in self.servos:
            return []
        s = self.servos[frame.ident]
        if inst == p.PING:
            return self._one(self._status(s.ident, b"", faults))
        if inst == p.READ and len(params) == 2:
            return self._one(self._read(s.ident, params[0], params[1], now, faults))
        if inst == p.WRITE and len(params) >= 2:
            s.write(params[0], params[1:], now)
            return self._one(self._status(s.ident, b"", faults))
        return []  # REG_WRITE, ACTION, ...: not emulated

    @staticmethod
    def _one(out: Out | None) -> list[Out]:
        return [out] if out is not None else []

    def _read(
        self, ident: int, address: int, length: int, now: float, faults: Faults
    ) -> Out | None:
        data = self.servos[ident].read(address, length, now)
        return self._status(ident, data or b"", faults)

    def _status(self, ident: int, data: bytes, faults: Faults) -> Out | None:
        if faults.active(ident, "silent"):
            return None
        error = OVERLOAD if faults.active(ident, "error") else 0
        raw = status_bytes(ident, data, faults, lambda i, d: p.status_packet(i, error, d))
        return Out(raw, self.servos[ident].return_delay_s)

    def _sync_write(self, address: int, length: int, body: bytes, now: float) -> None:
        step = length + 1
        for start in range(0, len(body) - step + 1, step):
            ident = body[start]
            if ident in self.servos:
                self.servos[ident].write(address, body[start + 1 : start + step], now)


def make_servo(ident: int, model: int, now: float) -> FeetechServo:
    return FeetechServo(ident, model, now)
