"""Emulated Dynamixel X-series servos speaking Protocol 2.0.

Each servo keeps an X-series control table; Present Position = shaft + Homing Offset
(the shaft reversed in Drive Mode bit 0); EEPROM (addresses below 64) is read-only while
torque is on; the Bus Watchdog (98) stops a servo that hears nothing for its period and
then refuses goal writes until 0 is written to it; a hardware error (the `error` fault)
sets Hardware Error Status (70), turns torque off and flags every status with the alert
bit until a REBOOT.
"""

from __future__ import annotations

import struct

from drivers.dynamixel import packet as p
from drivers.dynamixel import table as t
from drivers.emulators.device import Device, Faults, Out, corrupt, status_bytes
from drivers.emulators.servo import EmulatedServo
from drivers.servo.frames import Frame

EEPROM_END = 64
FIRMWARE = 46
OVERLOAD = 0x20


class DynamixelServo(EmulatedServo):
    torque_address = t.TORQUE_ENABLE
    goal_address = t.GOAL_POSITION
    return_delay_address = t.RETURN_DELAY_TIME

    def defaults(self) -> None:
        self.put(t.MODEL_NUMBER, self.model, 2)
        self.table[t.FIRMWARE_VERSION] = FIRMWARE
        self.table[t.ID] = self.ident
        self.table[t.BAUD_RATE] = 3
        self.table[t.RETURN_DELAY_TIME] = 250
        self.table[t.OPERATING_MODE] = 3
        self.put(t.MAX_POSITION_LIMIT, 4095, 4)
        self.table[t.STATUS_RETURN_LEVEL] = 2
        self.put(t.GOAL_POSITION, round(self.present()), 4, signed=True)

    def _reversed(self) -> bool:
        return bool(self.table[t.DRIVE_MODE] & 1)

    def present(self) -> float:
        offset = self.get(t.HOMING_OFFSET, 4, signed=True)
        return offset + (4096 - self.actual if self._reversed() else self.actual)

    def shaft(self, present: float) -> float:
        offset = self.get(t.HOMING_OFFSET, 4, signed=True)
        return 4096 - (present - offset) if self._reversed() else present - offset

    def goal(self) -> int:
        return self.get(t.GOAL_POSITION, 4, signed=True)

    def store_present(self) -> None:
        sign = -1 if self._reversed() else 1
        velocity = round(sign * self.velocity * 60 / 4096 / 0.229)  # 0.229 rev/min units
        current = round(0.05 * (self.target - self.actual)) if self.torque else 0
        self.put(t.PRESENT_CURRENT, max(-32768, min(32767, current)), 2, signed=True)
        self.put(t.PRESENT_VELOCITY, velocity, 4, signed=True)
        self.put(t.PRESENT_POSITION, round(self.present()), 4, signed=True)

    def writable(self, address: int, length: int) -> bool:
        if address < EEPROM_END and self.torque:
            return False  # EEPROM is locked while torque is on
        # a tripped watchdog refuses goals until cleared
        tripped = self.table[t.BUS_WATCHDOG] == 0xFF
        return not (tripped and address <= t.GOAL_POSITION < address + length)

    def written(self, address: int, length: int, now: float) -> None:
        if address <= t.TORQUE_ENABLE < address + length and self.torque:
            self.target = self.shaft(self.goal())
        if (
            address <= t.HOMING_OFFSET < address + length
            or address <= t.DRIVE_MODE < address + length
        ):
            self.put(t.GOAL_POSITION, round(self.present()), 4, signed=True)
            self.target = self.actual
        super().written(address, length, now)


class DynamixelDevice(Device):
    def __init__(self, servos: dict[int, EmulatedServo]) -> None:
        super().__init__(servos)
        self._last_packet = 0.0

    def parser(self) -> p.PacketParser:
        return p.PacketParser()

    def tick(self, now: float) -> None:
        self.check_watchdogs(now)
        self._last_packet = now

    def check_watchdogs(self, now: float) -> None:
        """Bus Watchdog: a servo with torque on that heard nothing for its period stops."""
        for s in self.servos.values():
            period = s.table[t.BUS_WATCHDOG]
            if s.torque and 0 < period < 0xFF and now - self._last_packet > period * 0.02:
                s.advance(self._last_packet + period * 0.02)
                s.hold_here()
                s.put(t.GOAL_POSITION, round(s.present()), 4, signed=True)
                s.table[t.BUS_WATCHDOG] = 0xFF

    def handle(self, frame: Frame, now: float, faults: Faults) -> list[Out]:
        inst, params = frame.head, frame.params
        if inst == p.STATUS:
            return []
        if inst in (p.SYNC_READ, p.FAST_SYNC_READ, p.SYNC_WRITE):
            if frame.ident != p.BROADCAST or len(params) < 4:
                return []
            address, length = struct.unpack_from("<HH", params)
            if inst == p.SYNC_WRITE:
                self._sync_write(address, length, params[4:], now, faults)
                return []
            ids = [i for i in params[4:] if i in self.servos]
            if inst == p.FAST_SYNC_READ:
                return self._fast_read(address, length, ids, now, faults)
            return [o for i in ids if (o := self._reply(i, now, faults, address, length))]
        targets = sorted(self.servos) if frame.ident == p.BROADCAST else [frame.ident]
        out = []
        for ident in targets:
            if ident not in self.servos:
                continue
            reply = self._unicast(ident, inst, params, now, faults, frame.ident == p.BROADCAST)
            if reply is not None:
                out.append(reply)
        return out

    def _unicast(
        self, ident: int, inst: int, params: bytes, now: float, faults: Faults, broadcast: bool
    ) -> Out | None:
        s = self.servos[ident]
        if inst == p.PING:
            return self._status(s, now, faults, struct.pack("<HB", s.model, FIRMWARE))
        if broadcast:
            if inst == p.WRITE and len(params) > 2:
                s.write(params[0] | params[1] << 8, params[2:], now)
            return None
        if inst == p.READ and len(params) == 4:
            address, length = struct.unpack("<HH", params)
            return self._reply(ident, now, faults, address, length)
        if inst == p.WRITE and len(params) > 2:
            if faults.has(ident, "refuse"):
                return self._status(s, now, faults, b"")
            ok = s.write(params[0] | params[1] << 8, params[2:], now)
            return self._status(s, now, faults, b"", 0 if ok else 7)
        if inst == p.REBOOT:
            s.table[t.HARDWARE_ERROR_STATUS] = 0
            s.table[t.TORQUE_ENABLE] = 0
            return self._status(s, now, faults, b"")
        return self._status(s, now, faults, b"", 2)  # instruction error

    def _reply(
        self, ident: int, now: float, faults: Faults, address: int, length: int
    ) -> Out | None:
        s = self.servos[ident]
        data = s.read(address, length, now)
        if data is None:
            return self._status(s, now, faults, b"", 7)
        return self._status(s, now, faults, data)

    def _status(
        self, s: EmulatedServo, now: float, faults: Faults, data: bytes, error: int = 0
    ) -> Out | None:
        self._conditions(s, faults)
        if faults.active(s.ident, "silent"):
            return None
        if faults.active(s.ident, "refuse"):
            error, data = 1, b""
        if s.table[t.HARDWARE_ERROR_STATUS]:
            error |= p.ALERT
        raw = status_bytes(s.ident, data, faults, lambda i, d: p.status_packet(i, error, d))
        return Out(raw, s.return_delay_s)

    @staticmethod
    def _conditions(s: EmulatedServo, faults: Faults) -> None:
        if faults.active(s.ident, "error"):
            s.table[t.HARDWARE_ERROR_STATUS] = OVERLOAD
            s.table[t.TORQUE_ENABLE] = 0
        if faults.has(s.ident, "stuff"):
            # current -1 and velocity -3: the state block then holds FF FF FD
            s.forced = {t.PRESENT_CURRENT: b"\xff\xff", t.PRESENT_VELOCITY: b"\xfd\xff\xff\xff"}
        else:
            s.forced = {}

    def _sync_write(
        self, address: int, length: int, body: bytes, now: float, faults: Faults
    ) -> None:
        step = length + 1
        for start in range(0, len(body) - step + 1, step):
            ident = body[start]
            if ident in self.servos and not faults.has(ident, "refuse"):
                self.servos[ident].write(address, body[start + 1 : start + step], now)

    def _fast_read(
        self, address: int, length: int, ids: list[int], now: float, faults: Faults
    ) -> list[Out]:
        entries, delay, broken = [], 0.0, False
        for ident in ids:
            s = self.servos[ident]
            self._conditions(s, faults)
            data = s.read(address, length, now) or b""
            if faults.active(ident, "silent") or faults.active(ident, "checksum"):
                broken = True  # a gap in the chain: the packet cannot be whole
                continue
            error = p.ALERT if s.table[t.HARDWARE_ERROR_STATUS] else 0
            if faults.active(ident, "refuse"):
                error, data = error | 1, bytes(length)
            entries.append((error, ident, data))
            delay = max(delay, s.return_delay_s)
        if not entries:
            return []
        raw = p.fast_status_packet(entries)
        return [Out(corrupt(raw) if broken else raw, delay)]


def make_servo(ident: int, model: int, now: float) -> DynamixelServo:
    return DynamixelServo(ident, model, now)
