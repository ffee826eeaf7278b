"""The operator-level episode state machine.

IDLE → RUNNING (start) → ENDED (stop / max_steps / done / watchdog) → RESETTING
→ reset_done → IDLE. FAULT latches from anywhere and is left only by clear_fault,
into IDLE, and only once its cause is gone. Pure logic: the kernel acts on the
transitions it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class State(StrEnum):
    IDLE = "IDLE"
    RUNNING = "RUNNING"
    ENDED = "ENDED"
    RESETTING = "RESETTING"
    FAULT = "FAULT"


class CommandRefused(Exception):
    """An operator command that does not apply in the present state; the message says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class Fault:
    cause: str  # estop | driver | safety | camera | startup
    detail: str
    active: bool = True  # the cause is still present (e-stop latch, driver down)


class EpisodeMachine:
    """Holds the state, the latched fault and the operator episode counter."""

    def __init__(self, start: str) -> None:
        self.episode = 0  # operator-level episode number; 0 before the first start
        self.outcome = ""
        self.fault: Fault | None = None
        if start == "latched":
            self.state = State.FAULT
            self.fault = Fault(
                "startup", "started latched: clear_fault to enable motion", active=False
            )
        else:
            self.state = State.IDLE

    def start(self) -> None:
        if self.state is not State.IDLE:
            raise CommandRefused("bad_state", f"start needs IDLE, state is {self.state}")
        self.episode += 1
        self.outcome = ""
        self.state = State.RUNNING

    def end(self, outcome: str) -> bool:
        """End the running episode with an outcome; False when nothing was running."""
        if self.state is not State.RUNNING:
            return False
        self.outcome = outcome
        self.state = State.ENDED
        return True

    def begin_reset(self) -> None:
        if self.state is State.ENDED:
            self.state = State.RESETTING

    def reset_done(self) -> None:
        if self.state not in (State.ENDED, State.RESETTING):
            raise CommandRefused(
                "bad_state", f"reset_done needs ENDED or RESETTING, state is {self.state}"
            )
        self.state = State.IDLE

    def latch(self, cause: str, detail: str, *, active: bool = True) -> bool:
        """Latch FAULT; True when this newly entered FAULT. A running episode ends as 'fault'."""
        if self.state is State.RUNNING:
            self.outcome = "fault"
        entered = self.state is not State.FAULT
        if entered or self.fault is None or not self.fault.active:
            self.fault = Fault(cause, detail, active)
        self.state = State.FAULT
        return entered

    def cause_gone(self, cause: str) -> None:
        if self.fault is not None and self.fault.cause == cause:
            self.fault.active = False

    def clear_fault(self) -> None:
        if self.state is not State.FAULT:
            raise CommandRefused("bad_state", f"clear_fault needs FAULT, state is {self.state}")
        assert self.fault is not None
        if self.fault.active:
            raise CommandRefused(
                "fault_active",
                f"cannot clear: {self.fault.cause} still present ({self.fault.detail})",
            )
        self.fault = None
        self.state = State.IDLE
