"""Protocol 2.0 as a `Codec` for drivers.servo.bus."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from drivers.dynamixel import packet as p
from drivers.servo.bus import Codec, Reply
from drivers.servo.frames import Frame


class DynamixelCodec(Codec):
    name = "dynamixel"
    has_fast_sync_read = True
    ping_data_length = 3  # model number, firmware version

    def __init__(self) -> None:
        self._fast_length = 0

    def parser(self) -> p.PacketParser:
        return p.PacketParser()

    def ping(self, ident: int) -> bytes:
        return p.ping(ident)

    def read(self, ident: int, address: int, length: int) -> bytes:
        return p.read(ident, address, length)

    def write(self, ident: int, address: int, data: bytes) -> bytes:
        return p.write(ident, address, data)

    def sync_read(self, address: int, length: int, ids: Sequence[int], fast: bool) -> bytes:
        if fast:
            self._fast_length = length  # a fast reply's entries carry no length of their own
        return p.sync_read(address, length, ids, fast=fast)

    def sync_write(self, address: int, length: int, items: Iterable[tuple[int, bytes]]) -> bytes:
        return p.sync_write(address, length, items)

    def replies(self, frame: Frame) -> list[Reply]:
        if frame.head != p.STATUS or not frame.params:
            return []  # an instruction packet (another master, or an echo not our own)
        if frame.ident == p.BROADCAST:
            return self._fast(frame.params)
        return [Reply(frame.ident, frame.params[0], frame.params[1:])]

    def _fast(self, params: bytes) -> list[Reply]:
        entries = p.split_fast_status(params, self._fast_length)
        if entries is None:
            return []
        return [Reply(ident, error, data) for error, ident, data in entries]

    def reply_bytes(self, data_length: int, count: int, fast: bool) -> int:
        if fast:
            return 8 + count * (data_length + 4)  # one packet: ERR ID DATA CRC each
        # header 4, id 1, len 2, inst 1, err 1, crc 2; stuffing may add a byte or two
        return count * (11 + data_length)

    def retryable(self, error: int) -> bool:
        return bool(error & 0x7F)

    def describe_error(self, error: int) -> str:
        words = []
        number = error & 0x7F
        if number:
            words.append(p.ERROR_NAMES.get(number, f"error {number}"))
        if error & p.ALERT:
            words.append("alert (hardware error)")
        return ", ".join(words) or "no error"
