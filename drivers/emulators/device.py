"""What an emulated bus's protocol side looks like to the bus loop (drivers.emulators.bus)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from drivers.emulators.faults import Fault
from drivers.emulators.servo import EmulatedServo
from drivers.servo.frames import Frame, FrameParser


@dataclass(frozen=True)
class Out:
    """One servo's reply: sent `delay_s` (its return delay) after the bus is free."""

    data: bytes
    delay_s: float


class Faults:
    """The faults in force; `active` spends one use of a counted fault."""

    def __init__(self, faults: list[Fault] | None = None) -> None:
        self.items: list[Fault] = list(faults or [])

    def active(self, ident: int, kind: str) -> bool:
        for f in self.items:
            if f.kind == kind and (kind == "echo" or f.ident == ident) and f.use():
                return True
        return False

    def has(self, ident: int, kind: str) -> bool:
        """In force (without spending a use)."""
        return any(
            f.kind == kind and f.ident == ident and (f.count is None or f.count > 0)
            for f in self.items
        )


class Device(ABC):
    """A protocol family's servos on one bus."""

    def __init__(self, servos: dict[int, EmulatedServo]) -> None:
        self.servos = servos

    @abstractmethod
    def parser(self) -> FrameParser: ...

    @abstractmethod
    def handle(self, frame: Frame, now: float, faults: Faults) -> list[Out]:
        """Carry out one instruction; the replies, in bus order."""

    def tick(self, now: float) -> None:  # noqa: B027 (a hook most families do not need)
        """Called before each instruction is handled (watchdogs)."""


def corrupt(data: bytes) -> bytes:
    """The same packet with a wrong checksum/CRC."""
    return data[:-1] + bytes(((data[-1] ^ 0x5A) or 1,))


def status_bytes(
    ident: int, data: bytes, faults: Faults, build: Callable[[int, bytes], bytes]
) -> bytes:
    """Servo `ident`'s status holding `data` (`build(claimed_id, data)` makes the packet)
    as its faults make it: another ID claimed (wrong_id), a data byte short (short), a bad
    checksum (checksum), or noise (garbage)."""
    claimed = wrong_id(ident) if faults.active(ident, "wrong_id") else ident
    if data and faults.active(ident, "short"):
        data = data[:-1]
    raw = build(claimed, data)
    if faults.active(ident, "checksum"):
        raw = corrupt(raw)
    if faults.active(ident, "garbage"):
        raw = garbage(len(raw))
    return raw


def garbage(n: int) -> bytes:
    """`n` bytes that hold no packet of either family (no 0xFF: no header can start)."""
    return bytes((0x55 + 7 * i) & 0x7F for i in range(n))


def wrong_id(ident: int) -> int:
    """The ID a `wrong_id` reply claims: another servo's, never the broadcast ID."""
    return (ident + 100) % 253
