"""The X-series Bus Watchdog (register 98): armed while torque is on, noticed when it trips.

Armed, a servo that hears no packet for its period stops by itself: Goal Position becomes
Present Position, the register reads 0xFF, and every goal written after that is ignored
until 0 is written to it. That is what should happen when robotd dies, but it also happens
when robotd lives and its bus goes quiet a while (the control process stalled, the USB
adapter held its bytes): the arm then stands still for good while the daemon goes on
commanding it. A sync write has no reply, so nothing would ever say so.

`heard()` is told of every whole state read. When the servos answer after a quiet spell
of more than QUIET_SHARE of the period (the servo counts from the last packet it heard,
we only know when its replies came: the margin covers that), each one's register is read
back; those at 0xFF are re-armed (0, then the period), counted and said in the log. Their
next goal moves them again. A servo that does not answer the check is checked after the
next whole read. Nothing here runs on a healthy tick: one clock reading.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from drivers.base import JointCounters
from drivers.dynamixel import table as t
from drivers.servo.bus import BusError, ServoBus
from drivers.servo.transport import TransportError
from robotd.repeats import Repeats

QUIET_SHARE = 0.75  # of the period: a quiet spell this long may have tripped it
TRIPPED = 0xFF
SAY_EVERY_S = 10.0  # one line per this at most, with how many trips went unsaid


class BusWatchdog:
    """The Bus Watchdog of servos `ids` (joints `names`), `units` × 20 ms (0: off)."""

    def __init__(
        self,
        ids: Sequence[int],
        names: Sequence[str],
        counters: Sequence[JointCounters],
        units: int,
        warn: Callable[[str], None],
    ) -> None:
        self.ids = tuple(ids)
        self.units = units
        self.period_s = units * t.WATCHDOG_UNIT_MS / 1e3
        self._name = dict(zip(ids, names))
        self._counters = dict(zip(ids, counters))
        self._warn = warn
        self._armed = False
        self._heard_ns = 0
        self._unchecked: set[int] = set()  # quiet too long, not read back yet
        self._said = Repeats(SAY_EVERY_S)  # a machine that stalls often trips it often

    def arm(self, bus: ServoBus) -> None:
        """Once torque is on (clears a tripped one first)."""
        if not self.units:
            return
        for ident in self.ids:
            bus.write(ident, t.BUS_WATCHDOG, b"\x00")
            bus.write(ident, t.BUS_WATCHDOG, bytes((self.units,)))
        self._armed = True
        self._heard_ns = time.monotonic_ns()
        self._unchecked.clear()

    def disarm(self, bus: ServoBus) -> None:
        """Once torque is off; one try each (torque off is what stops the arm, and a servo
        that did not answer it has had its tries)."""
        self._armed = False
        self._unchecked.clear()
        if not self.units:
            return
        for ident in self.ids:
            bus.write(ident, t.BUS_WATCHDOG, b"\x00", tries=1)

    def heard(self, bus: ServoBus) -> None:
        """Every servo just answered a state read: re-arm those that stopped meanwhile."""
        if not self._armed:
            return
        now = time.monotonic_ns()
        quiet_s = (now - self._heard_ns) / 1e9
        self._heard_ns = now
        if quiet_s > QUIET_SHARE * self.period_s:
            self._unchecked.update(self.ids)
        if self._unchecked:
            self._check(bus, quiet_s)

    def _check(self, bus: ServoBus, quiet_s: float) -> None:
        try:
            out = bus.sync_read(t.BUS_WATCHDOG, 1, sorted(self._unchecked))
        except TransportError:
            return  # the state read says what is wrong with the port
        tripped = []
        for ident, reply in out.replies.items():
            if reply.error & 0x7F or len(reply.data) != 1:
                continue  # refused or malformed: checked again after the next read
            self._unchecked.discard(ident)
            if reply.data[0] == TRIPPED:
                tripped.append(ident)
        rearmed = []
        for ident in tripped:
            try:
                bus.write(ident, t.BUS_WATCHDOG, b"\x00", tries=1)
                bus.write(ident, t.BUS_WATCHDOG, bytes((self.units,)), tries=1)
            except (BusError, TransportError):
                self._unchecked.add(ident)  # still stopped: try again next time
                continue
            self._counters[ident].watchdog_trips += 1
            rearmed.append(ident)
        if rearmed:
            self._say(rearmed, quiet_s)

    def _say(self, rearmed: list[int], quiet_s: float) -> None:
        said = self._said.say("tripped")
        if said is None:
            return
        joints = ", ".join(f"{self._name[i]} (servo {i})" for i in rearmed)
        self._warn(
            f"{joints} had stopped by themselves: their Bus Watchdog tripped (no packet for "
            f"{self.period_s * 1e3:.0f} ms, joints.options.watchdog_ms; the bus was quiet "
            f"{quiet_s * 1e3:.0f} ms). Re-armed: they follow goals again{said.tail}"
        )
