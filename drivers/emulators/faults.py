"""Faults an emulated bus can inject, and their command-line spelling.

    ID:KIND[:COUNT]   a servo's fault, for its next COUNT replies (default: all)
    echo              the adapter echoes every instruction back (half-duplex loopback)

KIND: silent (no reply), checksum (a reply with a bad checksum/CRC), error (the servo
reports a condition: Dynamixel alert with Overload in Hardware Error Status, Feetech the
overload bit), refuse (Dynamixel: error "result fail", the instruction not carried out),
stuff (Dynamixel: the servo's readings hold FF FF FD, so its replies need byte stuffing),
garbage (the reply replaced by as many bytes that hold no packet), wrong_id (a well-formed
reply claiming another servo's ID), short (a well-formed reply one data byte short).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("silent", "checksum", "error", "refuse", "stuff", "garbage", "wrong_id", "short")


@dataclass
class Fault:
    ident: int  # the servo (ignored for echo)
    kind: str  # one of KINDS, or "echo"
    count: int | None = None  # replies still affected; None: every one

    def use(self) -> bool:
        """True if this fault applies to the present reply (and spends one of its count)."""
        if self.count is None:
            return True
        if self.count <= 0:
            return False
        self.count -= 1
        return True


def parse_fault(text: str) -> Fault:
    """`3:silent`, `2:checksum:5`, `echo`; ValueError naming what is wrong."""
    if text == "echo":
        return Fault(0, "echo")
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"fault {text!r}: expected ID:KIND[:COUNT] or 'echo'")
    try:
        ident = int(parts[0])
        count = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(f"fault {text!r}: ID and COUNT must be whole numbers") from None
    if parts[1] not in KINDS:
        raise ValueError(f"fault {text!r}: kind must be one of {', '.join(KINDS)} or echo")
    if not 0 <= ident <= 252 or (count is not None and count < 1):
        raise ValueError(f"fault {text!r}: ID must be 0..252 and COUNT >= 1")
    return Fault(ident, parts[1], count)
