"""Dynamixel Protocol 2.0 packets: CRC-16, byte stuffing, building and streaming parsing.

Packet: FF FF FD 00 | ID | LEN_L LEN_H | INST | PARAMS... | CRC_L CRC_H, where LEN counts
INST, PARAMS and CRC. Inside INST and PARAMS the pattern FF FF FD is stuffed to
FF FF FD FD; LEN and CRC are computed over the stuffed bytes. CRC-16: polynomial 0x8005,
initial value 0, no reflection. A receiver checks the CRC on the stuffed bytes first, then
unstuffs.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from drivers.servo.frames import Corrupt, Frame

HEADER = b"\xff\xff\xfd\x00"
BROADCAST = 0xFE
MAX_ID = 0xFC
MAX_LENGTH = 4096  # far above any packet robotd sends or expects; a longer one is garbage

PING = 0x01
READ = 0x02
WRITE = 0x03
REBOOT = 0x08
STATUS = 0x55
SYNC_READ = 0x82
SYNC_WRITE = 0x83
FAST_SYNC_READ = 0x8A

ALERT = 0x80  # status error byte: a hardware error is latched (Hardware Error Status, 70)
ERROR_NAMES = {
    1: "result fail",
    2: "instruction error",
    3: "CRC error",
    4: "data range error",
    5: "data length error",
    6: "data limit error",
    7: "access error",
}


def _crc_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


_TABLE = _crc_table()


def crc16(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-16 of Protocol 2.0 (poly 0x8005, init 0, MSB first)."""
    table = _TABLE
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[((crc >> 8) ^ b) & 0xFF]
    return crc


def stuff(body: bytes | bytearray) -> bytes:
    """FF FF FD → FF FF FD FD, scanning left to right over what is emitted."""
    if b"\xff\xff\xfd" not in body:
        return bytes(body)
    out = bytearray()
    for b in body:
        out.append(b)
        if b == 0xFD and len(out) >= 3 and out[-2] == 0xFF and out[-3] == 0xFF:
            out.append(0xFD)
    return bytes(out)


def unstuff(body: bytes | bytearray) -> bytes | None:
    """The inverse of `stuff`; None when an FF FF FD is not followed by its stuffed FD."""
    if b"\xff\xff\xfd" not in body:
        return bytes(body)
    out = bytearray()
    skip = False
    for b in body:
        if skip:
            if b != 0xFD:
                return None
            skip = False
            continue
        out.append(b)
        if b == 0xFD and len(out) >= 3 and out[-2] == 0xFF and out[-3] == 0xFF:
            skip = True
    return None if skip else bytes(out)


def packet(ident: int, instruction: int, params: bytes | bytearray = b"") -> bytes:
    """A whole instruction (or status) packet, stuffed, with LEN and CRC."""
    if not 0 <= ident <= 0xFE or ident == 0xFD:
        raise ValueError(f"packet ID must be 0..252 or 254 (broadcast), got {ident}")
    body = stuff(bytes((instruction,)) + bytes(params))
    if len(body) + 2 > MAX_LENGTH:
        raise ValueError(f"packet too long: {len(body) + 2} > {MAX_LENGTH}")
    head = HEADER + struct.pack("<BH", ident, len(body) + 2) + body
    return head + struct.pack("<H", crc16(head))


def status_packet(ident: int, error: int, params: bytes = b"") -> bytes:
    """A status packet (the emulator's replies)."""
    return packet(ident, STATUS, bytes((error,)) + params)


def ping(ident: int) -> bytes:
    return packet(ident, PING)


def read(ident: int, address: int, length: int) -> bytes:
    return packet(ident, READ, struct.pack("<HH", address, length))


def write(ident: int, address: int, data: bytes) -> bytes:
    return packet(ident, WRITE, struct.pack("<H", address) + data)


def sync_read(address: int, length: int, ids: Iterable[int], *, fast: bool = False) -> bytes:
    return packet(
        BROADCAST,
        FAST_SYNC_READ if fast else SYNC_READ,
        struct.pack("<HH", address, length) + bytes(ids),
    )


def sync_write(address: int, length: int, items: Iterable[tuple[int, bytes]]) -> bytes:
    params = bytearray(struct.pack("<HH", address, length))
    for ident, data in items:
        if len(data) != length:
            raise ValueError(f"sync write to ID {ident}: {len(data)} bytes, expected {length}")
        params.append(ident)
        params += data
    return packet(BROADCAST, SYNC_WRITE, params)


def fast_status_packet(items: list[tuple[int, int, bytes]]) -> bytes:
    """A FAST_SYNC_READ reply: one packet from ID 0xFE holding, per servo, ERR ID DATA CRC,
    each servo's CRC running from the packet's first byte (the last one is the packet's).
    Its body is not stuffed: each servo appends its own part to a packet on the wire."""
    length = 1 + sum(len(data) + 4 for _, _, data in items)
    out = bytearray(HEADER + struct.pack("<BH", BROADCAST, length) + bytes((STATUS,)))
    for error, ident, data in items:
        out += bytes((error, ident)) + data
        out += struct.pack("<H", crc16(out))
    return bytes(out)


def split_fast_status(params: bytes, length: int) -> list[tuple[int, int, bytes]] | None:
    """(error, id, data) per servo from a FAST_SYNC_READ reply's params (after the STATUS
    byte, final CRC excluded); None when the size does not fit whole entries."""
    step = length + 4
    # the final entry's CRC is the packet's own and was stripped with it
    if (len(params) + 2) % step:
        return None
    out = []
    for start in range(0, len(params) + 2, step):
        out.append((params[start], params[start + 1], params[start + 2 : start + 2 + length]))
    return out


class PacketParser:
    """Streaming parser for Protocol 2.0, driven by the length field.

    Finds FF FF FD 00, reads ID and LEN, waits for LEN bytes, checks the CRC over the bytes
    as received (stuffed), then unstuffs the body. Anything refused yields a `Corrupt` and
    the search resumes one byte after the refused header (a real packet may start inside).
    A status from the broadcast ID (FAST_SYNC_READ) is not unstuffed.
    """

    def __init__(self, max_length: int = MAX_LENGTH) -> None:
        self._buf = bytearray()
        self._max = max_length

    def reset(self) -> None:
        self._buf.clear()

    def feed(self, data: bytes) -> list[Frame | Corrupt]:
        buf = self._buf
        buf += data
        out: list[Frame | Corrupt] = []
        while True:
            start = buf.find(HEADER)
            if start < 0:
                # keep a possible header prefix split across reads
                del buf[: max(0, len(buf) - 3)]
                return out
            if start:
                del buf[:start]
            if len(buf) < 7:
                return out
            ident = buf[4]
            length = buf[5] | (buf[6] << 8)
            if ident in (0xFD, 0xFF) or length < 3 or length > self._max:
                out.append(Corrupt(ident, f"bad header (id {ident}, length {length})"))
                del buf[:1]
                continue
            total = 7 + length
            if len(buf) < total:
                return out
            raw = bytes(buf[:total])
            if crc16(raw[:-2]) != raw[-2] | (raw[-1] << 8):
                out.append(Corrupt(ident, "CRC mismatch"))
                del buf[:1]
                continue
            del buf[:total]
            out.append(self._frame(ident, raw))

    @staticmethod
    def _frame(ident: int, raw: bytes) -> Frame | Corrupt:
        body = raw[7:-2]
        if not (ident == BROADCAST and body[:1] == bytes((STATUS,))):
            unstuffed = unstuff(body)
            if unstuffed is None:
                return Corrupt(ident, "bad byte stuffing")
            body = unstuffed
        return Frame(ident, body[0], body[1:], raw)
