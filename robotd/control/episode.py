"""The operator-level episode state machine.

IDLE → RUNNING (start) → ENDED (stop / max_steps / done / watchdog) → RESETTING
→ reset_done → IDLE. FAULT latches from anywhere and is left only by clear_fault,
into IDLE, and only once its cause is gone. Pure logic: the kernel acts on the
transitions it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal


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


STARTUP = "startup"  # the cause a real robot starts latched with

# What leaves a state for IDLE, said with a refused start (the lane's text is bounded).
_RESET_DONE = " (reset_done once the robot and scene are back at the start)"
_HOW = {
    State.IDLE: "",
    State.RUNNING: " (stop it first)",
    State.ENDED: _RESET_DONE,
    State.RESETTING: _RESET_DONE,
    State.FAULT: " (clear_fault to leave it)",
}

# What a latch did: entered FAULT (or replaced the start-up latch); added a later cause to
# it; or changed nothing (a cause still present latching again, as a failing driver does
# every tick: the same fault going on).
Latched = Literal["entered", "later", "repeat"]


@dataclass(slots=True)
class Fault:
    """The latched fault. `cause`/`detail` stay the first cause's: the one that stopped the
    robot. Causes latched after it are kept only as a count and the latest (a lane keeps
    nothing unbounded); `present` holds the persistent causes still present, each with its
    detail (at most one entry per persistent cause): while any is, it cannot be cleared."""

    cause: str  # estop | driver | safety | main_gone | startup
    detail: str
    present: dict[str, str] = field(default_factory=dict)
    later: int = 0  # causes latched after the first
    latest_cause: str = ""
    latest_detail: str = ""
    estop: bool = False  # an e-stop latched in this fault, first or later: it is shown as one

    @property
    def active(self) -> bool:
        """Some cause is still present (a driver down, the main process gone)."""
        return bool(self.present)


class EpisodeMachine:
    """Holds the state, the latched fault and the operator episode counter."""

    def __init__(self, start: str) -> None:
        self.episode = 0  # operator-level episode number; 0 before the first start
        self.outcome = ""
        self.fault: Fault | None = None
        if start == "latched":
            self.state = State.FAULT
            self.fault = Fault("startup", "no motion until an operator clears it")
        else:
            self.state = State.IDLE

    def start(self) -> None:
        if self.state is not State.IDLE:
            how = _HOW[self.state]
            raise CommandRefused("bad_state", f"start needs IDLE, state is {self.state}{how}")
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

    def latch(self, cause: str, detail: str, *, active: bool = True) -> Latched:
        """Latch FAULT for `cause` (`active`: it stays present until `cause_gone`). A running
        episode ends as 'fault'. The first cause stays the fault shown (the start-up latch
        excepted); a later one is counted and kept as the latest, and a cause already
        present is not counted again."""
        if self.state is State.RUNNING:
            self.outcome = "fault"
        f = self.fault
        # The start-up latch stopped nothing (nothing had moved yet): a real cause takes its
        # place as the first, rather than being shown as what came after it.
        if self.state is not State.FAULT or f is None or f.cause == STARTUP:
            self.state = State.FAULT
            self.fault = Fault(cause, detail, {cause: detail} if active else {})
            self.fault.estop = cause == "estop"
            return "entered"
        if cause in f.present:
            return "repeat"
        f.later += 1
        f.latest_cause, f.latest_detail = cause, detail
        f.estop = f.estop or cause == "estop"
        if active:
            f.present[cause] = detail
        return "later"

    def cause_gone(self, cause: str) -> None:
        # Called on every good read: a cheap no-op unless that cause is present.
        f = self.fault
        if f is not None and f.present:
            f.present.pop(cause, None)

    def clear_fault(self) -> None:
        if self.state is not State.FAULT:
            raise CommandRefused("bad_state", f"clear_fault needs FAULT, state is {self.state}")
        assert self.fault is not None
        if self.fault.present:
            cause, detail = next(iter(self.fault.present.items()))
            raise CommandRefused("fault_active", f"cannot clear: {cause} still present ({detail})")
        self.fault = None
        self.state = State.IDLE
