"""Whether an operator command that would move the robot again may still act, by when it
was sent: the two rules of time that stand between an operator and a surprise motion.

- Taken before the latest e-stop or fault: e-stops overtake other commands on their own
  socket (lane.sock), the lane latches faults of its own (a silent main process, a driver),
  and none must be undone by a command its operator could not have meant to follow it
  (`superseded`).
- Arriving after its client stopped waiting for the answer (the main process stopped or
  starved while it waited): its operator was told nobody answered, and a start that runs
  seconds later is a motion nobody expects (`expired`).
"""

from __future__ import annotations

from robotd.control.episode import CommandRefused


def undo_allowed(cmd: str, sent_ns: int, estop_ns: int, expires_ns: int, now_ns: int) -> None:
    """CommandRefused unless `cmd` may act (CLOCK_MONOTONIC ns; 0: unknown, not judged):
    `sent_ns` when it was taken, `estop_ns` the latest e-stop's, `expires_ns` when its
    client stops waiting, `now_ns` now."""
    if expires_ns and now_ns > expires_ns:
        raise CommandRefused(
            "expired",
            f"{cmd} reached the control lane {(now_ns - expires_ns) / 1e9:.1f} s after its "
            "client stopped waiting for the answer, so it is not carried out; send it again",
        )
    if sent_ns and sent_ns <= estop_ns:
        raise CommandRefused(
            "superseded",
            f"{cmd} was sent before the e-stop or fault that followed it, so it is not "
            "carried out; send it again once the robot is safe",
        )
