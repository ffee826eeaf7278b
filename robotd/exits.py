"""A process's end in words, from its return code as Popen and anyio give it (negative: the
signal that killed it), so the supervisor's log lines, the worker's errors and the trace
say a death alike: "exited with code 3", "killed by SIGKILL"."""

from __future__ import annotations

import signal


def signal_name(signum: int) -> str:
    """SIGKILL, SIGSEGV, ...; "signal N" for a number this platform has no name for."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_words(returncode: int) -> str:
    """How a process ended: "exited with code N", or "killed by SIGNAME" for a negative
    `returncode` (a code of -9 means nothing to a reader; SIGKILL does)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    return f"killed by {signal_name(-returncode)}"
