"""What the control lane does when its main process is gone or has gone silent.

Gone (PR_SET_PDEATHSIG): FAULT `main_gone` at once, held for control.orphan_s while lane.sock
still takes e-stops, then the e-stop category; the lane exits once torque off is written
(tried for ORPHAN_WRITE_S more when the driver refuses it).

Silent (nothing from it for control.main_silent_s, judged only once its first Beat came: a
process stopped, hung or starved of CPU sends nothing, and its death signal never comes):
FAULT `main_silent` (the robot holds, a running episode ends), held for control.orphan_s,
then the e-stop category. The lane stays: the main process may come back. When it speaks
again the cause is gone (said, with how long it was silent), and the latch stays until an
operator clears it, so nothing that was queued or timed out meanwhile moves the robot.
"""

from __future__ import annotations

import logging
import threading

from robotd.control.kernel import Kernel
from robotd.control.ports import ORPHAN_WRITE_S
from robotd.control.tick import TickIO

log = logging.getLogger("robotd.control")


class MainWatch:
    """Checked at every tick (`tick`), told of every message from the main process (`heard`).
    `io`: the lane's TickIO, whose `torque` and `failed` say what the driver last wrote."""

    def __init__(
        self, kernel: Kernel, io: TickIO, orphan_s: float, silent_s: float, stop: threading.Event
    ) -> None:
        self.kernel, self.io, self.stop = kernel, io, stop
        self.orphan_ns = round(orphan_s * 1e9)
        self.silent_ns = round(silent_s * 1e9)
        self.heard_ns: int | None = None  # the last message from main, once it beat
        self._since: int | None = None  # when the lane found main gone or silent
        self._estopped = False
        self.silent = False  # FAULT main_silent latched and main not heard since
        self.gone = False

    def heard(self, now_ns: int, beat: bool) -> None:
        """A message from the main process arrived (`beat`: a Beat)."""
        if self.heard_ns is None and not beat:
            return  # not judged before its first Beat (a test drives the lane by hand)
        if self.silent and not self.gone:
            silent_s = (now_ns - (self.heard_ns or now_ns)) / 1e9
            self.silent, self._since, self._estopped = False, None, False
            self.kernel.latch.cause_gone("main_silent")
            log.warning(
                "the main process speaks again after %.1f s of silence: the lane stays "
                "latched (FAULT) until an operator clears it",
                silent_s,
            )
        self.heard_ns = now_ns

    def tick(self, now_ns: int, orphaned: bool) -> None:
        """Latch and e-stop as the module docstring says; sets `stop` for a gone main."""
        if orphaned and not self.gone:
            self.gone, self._since, self._estopped = True, now_ns, False
            self.kernel.fault("main_gone", "the main process is gone: holding, then the e-stop")
            log.error(
                "the main process is gone: holding %g s, then the e-stop", self.orphan_ns / 1e9
            )
            return
        if not self.gone and not self.silent:
            self._check_silence(now_ns)
            return
        assert self._since is not None
        held_ns = now_ns - self._since
        if held_ns < self.orphan_ns or self.stop.is_set():
            return
        if not self._estopped:
            self._estopped = True
            what = "gone" if self.gone else "silent"
            held_s = self.orphan_ns / 1e9
            self.kernel.command("estop", f"the main process has been {what} {held_s:g} s")
            if not self.gone:  # its main process cannot say so while it is silent
                log.error("the main process is still silent: the e-stop is applied")
            return
        if self.gone:
            self._exit_when_off(held_ns)

    def _check_silence(self, now_ns: int) -> None:
        if self.heard_ns is None or now_ns - self.heard_ns < self.silent_ns:
            return
        self.silent, self._since = True, now_ns
        quiet_s = (now_ns - self.heard_ns) / 1e9
        self.kernel.fault(
            "main_silent", f"nothing from the main process for {quiet_s:.1f} s (stopped or hung?)"
        )
        log.error(
            "nothing from the main process for %.1f s (stopped or hung?): FAULT, holding %g s, "
            "then the e-stop; lane.sock still takes e-stops",
            quiet_s,
            self.orphan_ns / 1e9,
        )

    def _exit_when_off(self, held_ns: int) -> None:
        """A gone main's lane exits once torque off is written, or after ORPHAN_WRITE_S:
        nothing is left for it to do, and it would hold the port and lane.sock forever."""
        if not self.kernel.torque_on and not self.io.torque:  # off, and written
            log.error("the e-stop is applied (torque off): the control lane exits")
            self.stop.set()
        elif held_ns >= self.orphan_ns + ORPHAN_WRITE_S * 1e9:
            log.critical(
                "torque off could not be written for %g s (%s): the control lane exits "
                "anyway; the servos keep their last command unless their own watchdog stops "
                "them: check the robot",
                ORPHAN_WRITE_S,
                self.io.failed or "the driver did not confirm it",
            )
            self.stop.set()
