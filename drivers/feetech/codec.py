"""The STS protocol as a `Codec` for drivers.servo.bus."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from drivers.feetech import packet as p
from drivers.servo.bus import Codec, Reply
from drivers.servo.frames import Frame


class FeetechCodec(Codec):
    name = "feetech"
    has_fast_sync_read = False

    def parser(self) -> p.PacketParser:
        return p.PacketParser()

    def ping(self, ident: int) -> bytes:
        return p.ping(ident)

    def read(self, ident: int, address: int, length: int) -> bytes:
        return p.read(ident, address, length)

    def write(self, ident: int, address: int, data: bytes) -> bytes:
        return p.write(ident, address, data)

    def sync_read(self, address: int, length: int, ids: Sequence[int], fast: bool) -> bytes:
        return p.sync_read(address, length, ids)

    def sync_write(self, address: int, length: int, items: Iterable[tuple[int, bytes]]) -> bytes:
        return p.sync_write(address, length, items)

    def replies(self, frame: Frame) -> list[Reply]:
        # A status and an instruction share one format; instructions we send go to the
        # broadcast ID or carry an instruction code, and our own echo is dropped upstream.
        if frame.ident > p.MAX_ID:
            return []
        return [Reply(frame.ident, frame.head, frame.params)]

    def reply_bytes(self, data_length: int, count: int, fast: bool) -> int:
        return count * (6 + data_length)

    def retryable(self, error: int) -> bool:
        # The STS error byte reports the servo's condition (voltage, heat, load), not a
        # refused instruction: the data is good and repeating will not clear it.
        return False

    def describe_error(self, error: int) -> str:
        names = [name for bit, name in p.ERROR_BITS.items() if error & bit]
        names += [f"bit {b}" for b in range(8) if error & (1 << b) and (1 << b) not in p.ERROR_BITS]
        return ", ".join(names) or "no error"
