"""Transactions on a servo bus, shared by the protocol families.

A `Codec` builds one family's packets and reads its status replies; `ServoBus` runs
transactions over a `SerialTransport`: send one packet, collect the replies of the IDs
expected until each has answered or the deadline passes (computed from the bytes on the
wire, the servos' return delay and a slack). Nothing here retries on its own except the
unicast helpers used at open and torque changes; the per-tick read retries within the
tick's budget (drivers.servo.reader).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from drivers.servo.frames import Corrupt, Frame, FrameParser
from drivers.servo.transport import SerialTransport


@dataclass(frozen=True, slots=True)
class Reply:
    """One servo's status: its error byte and the data it returned."""

    ident: int
    error: int
    data: bytes


class Codec(ABC):
    """One protocol family's packets (Dynamixel Protocol 2.0, Feetech STS)."""

    name: str
    has_fast_sync_read: bool = False
    ping_data_length: int = 0  # data bytes in a ping's status

    @abstractmethod
    def parser(self) -> FrameParser: ...

    @abstractmethod
    def ping(self, ident: int) -> bytes: ...

    @abstractmethod
    def read(self, ident: int, address: int, length: int) -> bytes: ...

    @abstractmethod
    def write(self, ident: int, address: int, data: bytes) -> bytes: ...

    @abstractmethod
    def sync_read(self, address: int, length: int, ids: Sequence[int], fast: bool) -> bytes: ...

    @abstractmethod
    def sync_write(
        self, address: int, length: int, items: Iterable[tuple[int, bytes]]
    ) -> bytes: ...

    @abstractmethod
    def replies(self, frame: Frame) -> list[Reply]:
        """The status replies a frame carries ([] for anything that is not a status)."""

    @abstractmethod
    def reply_bytes(self, data_length: int, count: int, fast: bool) -> int:
        """Bytes on the wire of the replies of `count` servos with `data_length` data each."""

    @abstractmethod
    def retryable(self, error: int) -> bool:
        """True when the error byte says the instruction was not carried out (the data in
        the reply is not to be used and the transaction may be repeated)."""

    @abstractmethod
    def describe_error(self, error: int) -> str:
        """The error byte in words."""


@dataclass
class Outcome:
    """What one transaction got: the replies by ID, corrupt frames seen, the IDs
    expected that did not answer (in the order asked), and the IDs not asked that
    answered meanwhile (a servo set to the wrong ID, or a late reply)."""

    replies: dict[int, Reply] = field(default_factory=dict)
    corrupt: list[Corrupt] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    strays: list[int] = field(default_factory=list)


class BusError(Exception):
    """A unicast transaction failed after its tries; names the ID and why."""

    def __init__(self, message: str, *, ident: int, reason: str) -> None:
        super().__init__(message)
        self.ident = ident
        self.reason = reason  # "timeout" | "checksum" | "error"


class ServoBus:
    """Transactions on one bus. slack_s: the wait beyond wire time and return delays."""

    def __init__(
        self, codec: Codec, transport: SerialTransport, *, slack_s: float, return_delay_s: float
    ) -> None:
        self.codec = codec
        self.transport = transport
        self.slack_s = slack_s
        self.return_delay_s = return_delay_s
        self._parser = codec.parser()

    def expected_seconds(self, request: int, replies: int, count: int) -> float:
        """How long a transaction takes on a healthy bus: request and replies on the wire
        plus each servo's return delay."""
        return self.transport.wire_seconds(request + replies) + count * self.return_delay_s

    def transact(
        self,
        packet: bytes,
        expect: Sequence[int],
        reply_bytes: int,
        not_after_ns: int | None = None,
        data_length: int | None = None,
        slack_s: float | None = None,
    ) -> Outcome:
        """Send `packet`, collect one reply from each ID in `expect` until the expected time
        plus the slack (`slack_s`, else the bus's) has passed (and never after
        `not_after_ns`). A reply carrying other than `data_length` bytes is a late answer
        to an earlier transaction and is skipped, unless its error byte says the
        instruction was refused."""
        slack = self.slack_s if slack_s is None else slack_s
        wait = self.expected_seconds(len(packet), reply_bytes, len(expect)) + slack
        deadline_ns = time.monotonic_ns() + int(wait * 1e9)
        if not_after_ns is not None:
            deadline_ns = min(deadline_ns, not_after_ns)
        self._parser.reset()
        self.transport.send(packet)
        out = Outcome()
        wanted = set(expect)
        while wanted:
            frames = self.transport.receive(self._parser, deadline_ns)
            if frames is None:
                break
            for f in frames:
                if isinstance(f, Corrupt):
                    out.corrupt.append(f)
                    continue
                for r in self.codec.replies(f):
                    stale = (
                        data_length is not None
                        and len(r.data) != data_length
                        and not self.codec.retryable(r.error)
                    )
                    if r.ident in wanted and not stale:
                        wanted.discard(r.ident)
                        out.replies[r.ident] = r
                    elif r.ident not in expect:  # off the tick's path: replies not taken only
                        out.strays.append(r.ident)
        out.missing = [i for i in expect if i not in out.replies]
        return out

    def send_only(self, packet: bytes) -> None:
        """A broadcast that no servo answers (sync write)."""
        self.transport.send(packet)

    def sync_read(
        self,
        address: int,
        length: int,
        ids: Sequence[int],
        *,
        fast: bool = False,
        not_after_ns: int | None = None,
    ) -> Outcome:
        c = self.codec
        return self.transact(
            c.sync_read(address, length, ids, fast),
            ids,
            c.reply_bytes(length, len(ids), fast),
            not_after_ns,
            data_length=length,  # a late reply to another read (another length) is not ours
        )

    def sync_write(self, address: int, length: int, items: Iterable[tuple[int, bytes]]) -> None:
        self.send_only(self.codec.sync_write(address, length, items))

    def ping(self, ident: int, tries: int = 3) -> Reply:
        return self._unicast(self.codec.ping(ident), ident, self.codec.ping_data_length, tries)

    def read(self, ident: int, address: int, length: int, tries: int = 3) -> bytes:
        return self._unicast(self.codec.read(ident, address, length), ident, length, tries).data

    def write(self, ident: int, address: int, data: bytes, tries: int = 3) -> None:
        self._unicast(self.codec.write(ident, address, data), ident, 0, tries)

    def _unicast(self, packet: bytes, ident: int, data_length: int, tries: int) -> Reply:
        reason, detail = "timeout", "no reply"
        for _ in range(max(1, tries)):
            out = self.transact(
                packet, (ident,), self.codec.reply_bytes(data_length, 1, False), None, data_length
            )
            reply = out.replies.get(ident)
            if reply is not None and not self.codec.retryable(reply.error):
                return reply
            if reply is not None:
                reason, detail = "error", self.codec.describe_error(reply.error)
            elif out.corrupt:
                reason, detail = "checksum", out.corrupt[-1].reason
        raise BusError(
            f"servo {ident}: {detail} after {max(1, tries)} tries", ident=ident, reason=reason
        )
