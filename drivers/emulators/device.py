"""What an emulated bus's protocol side looks like to the bus loop (drivers.emulators.bus)."""

from __future__ import annotations

from abc import ABC, abstractmethod
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
