"""Feetech STS (SCS protocol) packets: checksum, building and streaming parsing.

Packet: FF FF | ID | LEN | INST (or a status's ERROR) | PARAMS... | CHECKSUM, where LEN =
len(PARAMS) + 2 and CHECKSUM = ~(ID + LEN + INST + sum(PARAMS)) & 0xFF. No byte stuffing:
the parser is driven by the length field and never rescans the inside of a good packet.
Registers are little-endian on the STS series.
"""

from __future__ import annotations

from collections.abc import Iterable

from drivers.servo.frames import Corrupt, Frame

BROADCAST = 0xFE
MAX_ID = 0xFC
MAX_LENGTH = 250  # the protocol's LEN is one byte; the servos' own buffers are smaller

PING = 0x01
READ = 0x02
WRITE = 0x03
SYNC_READ = 0x82
SYNC_WRITE = 0x83

# status error byte
ERROR_BITS = {
    0x01: "input voltage",
    0x02: "angle sensor",
    0x04: "overheat",
    0x08: "overcurrent",
    0x20: "overload",
}


def checksum(data: bytes | bytearray) -> int:
    """~(sum of ID, LEN, INST/ERROR and params) & 0xFF."""
    return ~sum(data) & 0xFF


def packet(ident: int, head: int, params: bytes | bytearray = b"") -> bytes:
    """A whole packet: instruction (head = INST) or status (head = ERROR)."""
    if not 0 <= ident <= 0xFE:
        raise ValueError(f"packet ID must be 0..252 or 254 (broadcast), got {ident}")
    if len(params) + 2 > MAX_LENGTH:
        raise ValueError(f"packet too long: {len(params) + 2} > {MAX_LENGTH}")
    body = bytes((ident, len(params) + 2, head)) + bytes(params)
    return b"\xff\xff" + body + bytes((checksum(body),))


def ping(ident: int) -> bytes:
    return packet(ident, PING)


def read(ident: int, address: int, length: int) -> bytes:
    return packet(ident, READ, bytes((address, length)))


def write(ident: int, address: int, data: bytes) -> bytes:
    return packet(ident, WRITE, bytes((address,)) + data)


def sync_read(address: int, length: int, ids: Iterable[int]) -> bytes:
    return packet(BROADCAST, SYNC_READ, bytes((address, length)) + bytes(ids))


def sync_write(address: int, length: int, items: Iterable[tuple[int, bytes]]) -> bytes:
    params = bytearray((address, length))
    for ident, data in items:
        if len(data) != length:
            raise ValueError(f"sync write to ID {ident}: {len(data)} bytes, expected {length}")
        params.append(ident)
        params += data
    return packet(BROADCAST, SYNC_WRITE, params)


def status_packet(ident: int, error: int, params: bytes = b"") -> bytes:
    return packet(ident, error, params)


class PacketParser:
    """Streaming parser: finds FF FF, reads ID and LEN, waits for the packet, checks the
    checksum. A refused header yields a `Corrupt` and the search resumes one byte on."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def reset(self) -> None:
        self._buf.clear()

    def feed(self, data: bytes) -> list[Frame | Corrupt]:
        buf = self._buf
        buf += data
        out: list[Frame | Corrupt] = []
        while True:
            start = buf.find(b"\xff\xff")
            if start < 0:
                del buf[: max(0, len(buf) - 1)]
                return out
            if start:
                del buf[:start]
            if len(buf) < 4:
                return out
            ident, length = buf[2], buf[3]
            if ident == 0xFF:
                del buf[:1]  # a longer run of FF: the header is further on
                continue
            if length < 2 or length > MAX_LENGTH:
                out.append(Corrupt(ident, f"bad header (id {ident}, length {length})"))
                del buf[:1]
                continue
            total = 4 + length
            if len(buf) < total:
                return out
            raw = bytes(buf[:total])
            if checksum(raw[2:-1]) != raw[-1]:
                out.append(Corrupt(ident, "checksum mismatch"))
                del buf[:1]
                continue
            del buf[:total]
            out.append(Frame(ident, raw[4], raw[5:-1], raw))
