"""What a servo protocol's streaming parser yields: whole frames, or word of a corrupt one.

Both protocol families (Dynamixel Protocol 2.0, Feetech STS) frame their packets the same
way in outline: a header, an ID, a length, then that many bytes. Their parsers are driven
by the length field and hand out either a `Frame` (checksum good, body unstuffed) or a
`Corrupt` (what the header claimed and why it was refused), never raising on any input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Frame:
    """One packet whose checksum matched.

    ident: the packet ID. head: the first byte after the length (Dynamixel: the
    instruction, 0x55 for a status; Feetech: the instruction, or a status's error byte).
    params: what follows head, unstuffed (Dynamixel status: error byte first). raw: the
    bytes exactly as they were on the wire (for recognising an echo of what we sent).
    """

    ident: int
    head: int
    params: bytes
    raw: bytes


@dataclass(frozen=True, slots=True)
class Corrupt:
    """Bytes that looked like a packet but were refused (bad checksum, bad stuffing, a
    length out of bounds). ident is what the header claimed: a hint, not a fact."""

    ident: int
    reason: str


class FrameParser(Protocol):
    """A streaming parser: bytes in, in any chunking; frames out, in order."""

    def feed(self, data: bytes) -> list[Frame | Corrupt]:
        """Take more bytes; return every frame (or corrupt one) completed by them."""
        ...

    def reset(self) -> None:
        """Forget any partial packet (before a new transaction)."""
        ...
