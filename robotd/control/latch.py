"""The fault latch: what FAULT does to the drives, and what clearing it takes.

FAULT itself is a state of the EpisodeMachine; this class owns its consequences:
- the e-stop category (safety.estop_category): 0 turns torque off at once; 1 holds the last approved
  target for a controlled stop (`stop_ticks`), then turns torque off;
- after clear_fault, torque on again and the shield re-anchored where the joints are now
  (they may have sagged or been pushed while torque was off: never jump back);
- which causes stay present: an e-stop is gone once latched (the operator clears it), a
  safety fault once the offending chunk is flushed (it is, as the fault latches), a driver
  fault only when a read succeeds again;
- what status shows (`shown`): the first cause, the one that stopped the robot; causes that
  latch after it only as their count and the latest (nothing unbounded in the lane). The
  work is done as a cause latches, never per tick.
"""

from __future__ import annotations

from collections.abc import Callable

from robotd.control.episode import EpisodeMachine
from robotd.lane.messages import MAX_TEXT, Fault

# A cause that stays present until it is seen gone (the driver reads again, a silent main
# process speaks again; a main process never comes back to a lane it orphaned); every other
# cause is gone once it has latched.
PERSISTENT_CAUSES = frozenset({"driver", "main_gone", "main_silent"})


class FaultLatch:
    """Latches FAULT on the machine and applies its consequences tick by tick.

    `torque_on`: whether the drives may hold (the caller switches them when it changes).
    `anchored`: False until the shield was anchored at the joints' present position
    (at start-up and after every clear_fault); the kernel anchors it on the next read.
    """

    def __init__(
        self,
        machine: EpisodeMachine,
        *,
        estop_category: int,
        stop_ticks: int,
        event: Callable[..., None],
    ) -> None:
        self.machine = machine
        self.category = estop_category
        self.stop_ticks = max(1, stop_ticks)
        self._event = event
        self.torque_on = True
        self.anchored = False
        self._torque_off_at: int | None = None

    def latch(self, cause: str, detail: str, tick: int) -> bool:
        """Latch FAULT for `cause`; True when it is the fault's first cause (then an event
        says so; a later cause's event names the first). An e-stop starts its category
        whatever state it finds, FAULT included: a robot latched for another cause and
        still holding stops all the same."""
        m = self.machine
        latched = m.latch(cause, detail, active=cause in PERSISTENT_CAUSES)
        if cause == "estop" and self.torque_on and self._torque_off_at is None:
            if self.category == 0:
                self._torque(False)
            else:
                self._torque_off_at = tick + self.stop_ticks
        if latched == "entered":
            self._event("fault", cause=cause, detail=detail)
        elif latched == "later" and m.fault is not None:
            # logged too, though the fault shown stays the first: which cause came after which
            f = m.fault
            self._event("fault", cause=cause, detail=detail, after=f.cause, later=f.later)
        return latched == "entered"

    def shown(self) -> Fault | None:
        """The latched fault as status shows it (None when there is none)."""
        f = self.machine.fault
        if f is None:
            return None
        present = next(iter(f.present), "")
        return Fault(f.cause, f.detail[:MAX_TEXT], f.active, f.later, f.latest_cause,
                     f.latest_detail[:MAX_TEXT], present, f.estop)

    def clear(self) -> None:
        """clear_fault: into IDLE (CommandRefused while the cause is present), torque on,
        the shield to be re-anchored at the joints' present position."""
        self.machine.clear_fault()
        self._torque_off_at = None
        self.torque_on = True
        self.anchored = False
        self._event("fault_cleared")

    def cause_gone(self, cause: str) -> None:
        """A persistent cause is no longer present (e.g. the driver read again)."""
        self.machine.cause_gone(cause)

    def tick(self, tick: int) -> None:
        """Apply a category-1 stop's torque-off when its time has come."""
        if self._torque_off_at is not None and tick >= self._torque_off_at:
            self._torque_off_at = None
            self._torque(False)

    def torque_off_in(self, tick: int) -> int | None:
        """Ticks left, at `tick`, of a category-1 stop before torque goes off; None when no
        stop is under way (torque already off, or no e-stop)."""
        if self._torque_off_at is None:
            return None
        return max(0, self._torque_off_at - tick)

    def _torque(self, on: bool) -> None:
        if self.torque_on != on:
            self.torque_on = on
            self._event("torque_on" if on else "torque_off")
