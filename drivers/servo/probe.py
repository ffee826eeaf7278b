"""A read-only look at a servo arm's bus (`robotd check --probe`): per configured servo a
ping, its model number, its homing offset (and drive mode, where the servo has one) and
its present position; when a servo does not answer, which IDs on the bus do.

Read-only by construction: the only packets built here are PING and READ (the family's
codec builds them, drivers.servo.bus carries them); nothing is written, torque is never
touched. Every byte from the bus is untrusted: whatever comes instead of the reply asked
for (nothing, a bad checksum, another servo's ID, a reply too short or too long, bytes
that hold no packet, a status error byte) becomes a named `fault` of that servo, never an
exception. Time is bounded: each transaction has a deadline (its wire time plus a slack),
the servos' reads share one budget and the scan another.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from drivers.dynamixel import packet as dxp
from drivers.dynamixel import table as dxt
from drivers.servo.bus import Reply, ServoBus
from drivers.servo.homing import FAMILIES, Family, decode_register
from drivers.servo.transport import SerialTransport

SLACK_S = 0.1  # a configured servo's reply may come late by a USB adapter's latency timer
TRIES = 2  # a configured servo is asked twice before it is called silent
SCAN_SLACK_S = 0.015  # per ID of a scan: most IDs are empty, and 254 of them are waited for
READ_BUDGET_S = 10.0  # all the configured servos' transactions
SCAN_BUDGET_S = 8.0  # the whole scan
SCAN_LAST_ID = {"dynamixel": 252, "feetech": 253}
MODEL_NAMES = {protocol: f.model_names for protocol, f in FAMILIES.items()}
HOMING_SIGN_BIT = {"dynamixel": None, "feetech": 11}  # None: 4 bytes, two's complement


# What came instead of a usable reply: nothing, another ID's reply, a corrupt frame, bytes
# that made no packet, a reply refusing the instruction, one of the wrong length.
FaultKind = Literal["silent", "stray", "corrupt", "garbage", "refused", "short"]


@dataclass
class ServoReading:
    """What one configured servo answered. `fault` names the first thing that stopped its
    reads (None: all were answered); `condition` a status error byte on data still usable
    (a Dynamixel alert, a Feetech overload bit). Unread values are None."""

    ident: int
    answered: bool = False  # a well-formed reply from this ID came to the ping
    model: int | None = None
    homing_offset: int | None = None
    drive_mode: int | None = None
    position: int | None = None  # Present Position as the servo reports it now
    fault: str | None = None
    fault_kind: FaultKind | None = None  # what came instead (Unanswered.kind)
    condition: str | None = None


@dataclass
class Scan:
    """The IDs that answered a ping, of `first..last`; `stopped_at` the ID the scan's budget
    ran out at (None: all asked)."""

    found: list[int] = field(default_factory=list)
    last: int = 0
    stopped_at: int | None = None


class Unanswered(Exception):
    """A transaction got no usable reply; `kind` says what came instead, the message names
    it, `strays` the IDs that answered in its place."""

    def __init__(self, kind: FaultKind, message: str, strays: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.kind: FaultKind = kind
        self.strays = list(strays)


class Prober:
    """The transactions of a probe on an open `bus` of `protocol`, within `not_after_ns`."""

    def __init__(self, protocol: str, bus: ServoBus, not_after_ns: int) -> None:
        self.protocol = protocol
        self.family: Family = FAMILIES[protocol]
        self.bus = bus
        self.not_after_ns = not_after_ns

    def exchange(self, packet: bytes, ident: int, length: int, slack_s: float) -> Reply:
        """Send `packet`; the first well-formed reply of `ident`, or Unanswered naming what
        came instead (another ID, a corrupt frame, bytes that made no packet, nothing) by
        the transaction's deadline (wire time plus `slack_s`) or the probe's."""
        bus = self.bus
        before = bus.transport.bytes_in
        expect = bus.codec.reply_bytes(length, 1, False)
        out = bus.transact(packet, (ident,), expect, self.not_after_ns, slack_s=slack_s)
        reply = out.replies.get(ident)
        if reply is not None:
            return reply
        if out.strays:
            raise Unanswered("stray", f"a reply from id {out.strays[0]}, not {ident}", out.strays)
        if out.corrupt:
            raise Unanswered("corrupt", f"corrupt reply ({out.corrupt[0].reason})")
        if bus.transport.bytes_in > before:
            got = bus.transport.bytes_in - before
            raise Unanswered("garbage", f"garbage ({got} bytes, no status packet)")
        raise Unanswered("silent", "no answer")

    def ask(self, packet: bytes, ident: int, length: int) -> Reply:
        """`exchange` tried up to TRIES times, its reply refused when its error byte says
        the instruction was not carried out or it holds other than `length` data bytes."""
        codec = self.bus.codec
        for attempt in range(TRIES):
            try:
                reply = self.exchange(packet, ident, length, SLACK_S)
                if codec.retryable(reply.error):  # refused: its data is not data
                    why = f"status error: {codec.describe_error(reply.error)}"
                    raise Unanswered("refused", why)
                if len(reply.data) != length:
                    raise Unanswered(
                        "short",
                        f"a reply with {len(reply.data)} data byte(s), {length} expected"
                    )
                return reply
            except Unanswered:
                if attempt == TRIES - 1 or time.monotonic_ns() >= self.not_after_ns:
                    raise
        raise AssertionError("unreachable")

    def read(self, ident: int, address: int, length: int, errors: list[int]) -> bytes:
        """Registers of a configured servo; its status error byte appended to `errors`."""
        reply = self.ask(self.bus.codec.read(ident, address, length), ident, length)
        errors.append(reply.error)
        return reply.data

    def servo(self, ident: int) -> ServoReading:
        """Ping, model, homing offset, drive mode and position of one configured servo;
        the first failure is its `fault` and ends its reads."""
        out = ServoReading(ident)
        codec, f = self.bus.codec, self.family
        errors: list[int] = []
        try:
            errors.append(self.ask(codec.ping(ident), ident, codec.ping_data_length).error)
            out.answered = True
            out.model = int.from_bytes(self.read(ident, f.model, 2, errors), "little")
            sign_bit = HOMING_SIGN_BIT[self.protocol]
            offset = self.read(ident, f.homing, 4 if sign_bit is None else 2, errors)
            out.homing_offset = decode_register(offset, sign_bit)
            if f.drive_mode is not None:
                out.drive_mode = self.read(ident, f.drive_mode, 1, errors)[0] & 1
            present = self.read(ident, f.present, f.present_size, errors)
            out.position = decode_register(present, f.sign_bit)
        except Unanswered as exc:
            out.fault, out.fault_kind = str(exc), exc.kind
        conditions = [e for e in errors if e]
        if conditions:
            out.condition = self._condition(ident, conditions[0])
        return out

    def _condition(self, ident: int, error: int) -> str:
        """A status error byte on usable data in words; a Dynamixel's alert bit by its
        Hardware Error Status (read, as the driver names it), when that read is answered."""
        text = self.bus.codec.describe_error(error)
        if self.protocol != "dynamixel" or not error & dxp.ALERT:
            return text
        try:
            value = self.read(ident, dxt.HARDWARE_ERROR_STATUS, 1, [])[0]
        except Unanswered:
            return text
        names = dxt.hardware_error_names(value) or ["none reported"]
        return f"hardware error: {', '.join(names)} (Hardware Error Status {value:#04x})"

    def scan(self, not_after_ns: int) -> Scan:
        """Ping every ID of the family, once each, within SCAN_SLACK_S; any well-formed
        reply (from the ID asked, or another: late or misaddressed) is an ID on the bus."""
        codec = self.bus.codec
        out, found = Scan(last=SCAN_LAST_ID[self.protocol]), set()
        saved, self.not_after_ns = self.not_after_ns, not_after_ns
        try:
            for ident in range(out.last + 1):
                if time.monotonic_ns() >= not_after_ns:
                    out.stopped_at = ident
                    break
                try:
                    self.exchange(codec.ping(ident), ident, codec.ping_data_length, SCAN_SLACK_S)
                    found.add(ident)
                except Unanswered as exc:
                    found.update(exc.strays)
        finally:
            self.not_after_ns = saved
        out.found = sorted(found)
        return out


def open_bus(protocol: str, port: str, baud: int, low_latency: bool = True) -> ServoBus:
    """The arm's bus, opened as the driver opens it (exclusively: a port another process
    holds fails with EAGAIN); drivers.servo.transport.TransportError if it cannot be."""
    transport = SerialTransport(port, baud, low_latency=low_latency)
    transport.open()
    return ServoBus(FAMILIES[protocol].codec(), transport, slack_s=SLACK_S, return_delay_s=0.0005)


def probe_servos(
    protocol: str, bus: ServoBus, ids: Sequence[int], *, scan: bool
) -> tuple[list[ServoReading], Scan | None]:
    """Each of `ids` read (`Prober.servo`), those left when the budget ran out named so;
    then, if `scan` and any of them did not answer its ping, the bus scanned."""
    now = time.monotonic_ns()
    prober = Prober(protocol, bus, now + int(READ_BUDGET_S * 1e9))
    readings = []
    for ident in ids:
        if time.monotonic_ns() >= prober.not_after_ns:
            readings.append(ServoReading(ident, fault=f"not asked: {READ_BUDGET_S:g} s spent"))
            continue
        readings.append(prober.servo(ident))
    found = None
    if scan and any(not r.answered for r in readings):
        found = prober.scan(time.monotonic_ns() + int(SCAN_BUDGET_S * 1e9))
    return readings, found


def position_after_open(
    protocol: str, reading: ServoReading, homing_offset: int, drive_mode: int
) -> int | None:
    """The Present Position the servo will report once the driver's open has written the
    calibration's `homing_offset` (Present = actual + offset_sign · offset, the family's
    rule: drivers.servo.homing), from what it reports now under its own offset. None when
    nothing was read, or when the servo's drive mode is not the calibration's (a reversal
    is no offset: the position is then not judged)."""
    if reading.position is None or reading.homing_offset is None:
        return None
    if reading.drive_mode is not None and reading.drive_mode != drive_mode:
        return None
    sign = FAMILIES[protocol].offset_sign
    return reading.position + sign * (homing_offset - reading.homing_offset)
