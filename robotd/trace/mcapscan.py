"""A strict, bounded scan of an MCAP file's records, for files that may be torn.

The file is walked record by record. Every length is checked against the bytes that are
really there before anything is read, every chunk is decompressed to exactly its stated
size and checked against its CRC before any message in it is handed out, and the first
thing that does not hold (a cut record, a bad CRC, bytes that are no record) ends the
scan with a `Stop` that says where and why. A crash mid-write therefore loses the chunk
being written and nothing before it, and nothing after the damage is taken for data.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

MAGIC = b"\x89MCAP0\r\n"
OP_HEADER, OP_FOOTER, OP_SCHEMA, OP_CHANNEL, OP_MESSAGE, OP_CHUNK = 1, 2, 3, 4, 5, 6
OP_MESSAGE_INDEX, OP_ATTACHMENT, OP_METADATA, OP_DATA_END = 0x07, 0x09, 0x0C, 0x0F
_KNOWN = set(range(0x01, 0x10))  # the opcodes the MCAP spec defines
# What the data section may hold outside chunks (the MCAP spec's header, schemas,
# channels, metadata, attachments and the data end; chunks and their indexes apart)
_DATA_SECTION = {OP_HEADER, OP_SCHEMA, OP_CHANNEL, OP_ATTACHMENT, OP_METADATA, OP_DATA_END}
_HEAD = struct.Struct("<BQ")
_MSG = struct.Struct("<HIQQ")
MAX_RECORD = 1 << 30
MAX_CHUNK_UNCOMPRESSED = 1 << 30


class ScanError(ValueError):
    """Bytes that are not what their record says; the text names what."""


@dataclass(frozen=True)
class Schema:
    id: int
    name: str
    encoding: str
    data: bytes


@dataclass(frozen=True)
class Channel:
    id: int
    schema_id: int
    topic: str
    encoding: str


@dataclass(frozen=True)
class Message:
    channel_id: int
    sequence: int
    log_time: int
    data: bytes


@dataclass(frozen=True)
class Metadata:
    name: str
    values: dict[str, str]


@dataclass(frozen=True)
class Stop:
    """Where the scan ended: cleanly at the footer, at the end of the bytes, or at damage."""

    offset: int  # bytes of whole, valid records (from the start of the file)
    size: int
    complete: bool  # a footer was found
    damage: str  # "" when the scan ended at the footer or exactly at the end of the bytes


@dataclass(frozen=True)
class Skipped:
    """A record of the summary section (after the data end) that does not parse: skipped.
    It holds no messages (those are all in the chunks before it)."""

    offset: int
    why: str


Record = Schema | Channel | Message | Metadata


class _Cursor:
    """Reads fields from one record's bytes; running past the end is a ScanError."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ScanError(f"{self.what}: a field runs past the record's end")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        raw = self.take(self.u32())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ScanError(f"{self.what}: a string that is not UTF-8") from None

    def string_map(self) -> dict[str, str]:
        n = self.u32()
        end = self.pos + n
        if end > len(self.data):
            raise ScanError(f"{self.what}: a map runs past the record's end")
        out = {}
        while self.pos < end:
            key = self.string()
            out[key] = self.string()
        if self.pos != end:
            raise ScanError(f"{self.what}: a map's entries overrun its length")
        return out

    def rest(self) -> bytes:
        return self.take(len(self.data) - self.pos)


def _parse(op: int, body: bytes) -> Record | None:
    if op == OP_SCHEMA:
        c = _Cursor(body, "schema")
        return Schema(c.u16(), c.string(), c.string(), c.take(c.u32()))
    if op == OP_CHANNEL:
        c = _Cursor(body, "channel")
        cid, sid, topic, enc = c.u16(), c.u16(), c.string(), c.string()
        c.string_map()
        return Channel(cid, sid, topic, enc)
    if op == OP_MESSAGE:
        c = _Cursor(body, "message")
        cid, seq, log_time, _publish = c.u16(), c.u32(), c.u64(), c.u64()
        return Message(cid, seq, log_time, c.rest())
    if op == OP_METADATA:
        c = _Cursor(body, "metadata")
        return Metadata(c.string(), c.string_map())
    return None


def _check_message_index(body: bytes) -> None:
    """A message index is skipped, but its length must be its own: a damaged length would
    otherwise send the scan past whole chunks without a word."""
    c = _Cursor(body, "message index")
    c.u16()
    if c.u32() != len(body) - 6 or (len(body) - 6) % 16:
        raise ScanError("message index: its length does not match its entries")


def _decompress(kind: str, data: bytes, size: int) -> bytes:
    if kind == "":
        return data
    if kind == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    if kind == "lz4":
        import lz4.frame

        d = lz4.frame.LZ4FrameDecompressor()
        out = d.decompress(data, max_length=size)
        if not d.eof:
            raise ScanError("chunk: more data than its stated size")
        return out
    raise ScanError(f"chunk: unknown compression {kind[:20]!r}")


def chunk_records(body: bytes) -> list[Record]:
    """The records of a chunk, after checking its size and CRC (ScanError when either fails)."""
    c = _Cursor(body, "chunk")
    c.u64(), c.u64()  # message start and end time
    size, crc = c.u64(), c.u32()
    kind = c.string()
    data = c.take(c.u64())
    if c.pos != len(body):  # our chunks have no trailing bytes: a wrong length is damage
        raise ScanError("chunk: its record length does not match its fields")
    if size > MAX_CHUNK_UNCOMPRESSED:
        raise ScanError(f"chunk: claims {size} bytes uncompressed")
    if crc == 0:
        raise ScanError("chunk: has no CRC (robotd always writes one)")
    try:
        plain = _decompress(kind, data, size)
    except ScanError:
        raise
    except Exception as exc:  # zstd/lz4 errors have no common base
        raise ScanError(f"chunk: does not decompress ({type(exc).__name__})") from None
    if len(plain) != size or zlib.crc32(plain) != crc:
        raise ScanError("chunk: fails its CRC")
    out: list[Record] = []
    pos, n = 0, len(plain)
    while pos < n:
        if pos + 9 > n:
            raise ScanError("chunk: a record header runs past the chunk's end")
        op, length = _HEAD.unpack_from(plain, pos)
        pos += 9
        end = pos + length
        if end > n:
            raise ScanError("chunk: a record runs past the chunk's end")
        if op == OP_MESSAGE:  # the common case, parsed in one go
            if length < _MSG.size:
                raise ScanError("message: shorter than its fixed fields")
            cid, seq, log_time, _publish = _MSG.unpack_from(plain, pos)
            out.append(Message(cid, seq, log_time, plain[pos + _MSG.size : end]))
        else:
            record = _parse(op, plain[pos:end])
            if record is not None:
                out.append(record)
        pos = end
    return out


def _records(op: int, body: bytes, pos: int, data: bool) -> list[Record | Skipped]:
    """What one record outside the chunks holds (ScanError: the scan stops there).

    No CRC covers these records, their opcode byte included. In the data section a record
    that is not what that section holds, or does not parse, may be a chunk whose opcode
    was damaged: it is read as the chunk it is if it passes as one (its CRC), else it ends
    the scan, so that no chunk is ever passed over without a word. In the summary (after
    the data end) a record that does not parse is skipped: it holds no messages."""
    if op == OP_CHUNK:
        return list(chunk_records(body))
    if op == OP_MESSAGE:
        raise ScanError("a message outside a chunk (no CRC covers it)")
    try:
        if op == OP_MESSAGE_INDEX:
            _check_message_index(body)
            return []
        if data and (op not in _DATA_SECTION or (op == OP_HEADER and pos != len(MAGIC))):
            raise ScanError(f"a record of opcode {op:#04x} where the data section has none")
        parsed = _parse(op, body)
    except ScanError as exc:
        if not data:
            return [Skipped(pos, str(exc))]
        try:
            return list(chunk_records(body))  # a chunk whose opcode byte was damaged
        except ScanError:
            raise exc from None
    return [parsed] if parsed is not None else []


def scan(f: BinaryIO, size: int) -> Iterator[Record | Skipped | Stop]:
    """Every valid record of an MCAP file in order, then one `Stop`.

    Chunks are opened and their records yielded only once the whole chunk checked out;
    records outside chunks other than schemas, channels and metadata are skipped."""
    if f.read(len(MAGIC)) != MAGIC:
        raise ScanError("not an MCAP file (bad magic)")
    pos = len(MAGIC)
    data = True  # in the data section (before the data end record)
    while True:
        head = f.read(9)
        if not head:
            yield Stop(pos, size, False, "")
            return
        if len(head) < 9:
            yield Stop(pos, size, False, f"a record header cut short at byte {pos}")
            return
        op, length = struct.unpack("<BQ", head)
        if op not in _KNOWN:
            yield Stop(pos, size, False, f"bytes that are no MCAP record at byte {pos}")
            return
        if length > size - pos - 9 or length > MAX_RECORD:
            yield Stop(pos, size, False, f"a record cut short at byte {pos} ({length} bytes)")
            return
        body = f.read(length)
        try:
            records = _records(op, body, pos, data)
        except ScanError as exc:
            yield Stop(pos, size, False, f"{exc} at byte {pos}")
            return
        yield from records
        pos += 9 + length
        data = data and op != OP_DATA_END
        if op == OP_FOOTER:
            tail = f.read(len(MAGIC))
            ok = tail == MAGIC
            yield Stop(pos + len(tail), size, ok, "" if ok else "no closing magic after the footer")
            return
