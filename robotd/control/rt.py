"""Realtime settings for the control process: SCHED_FIFO, mlockall, timer slack, gc.freeze.

Every function here is best effort: it never raises for a refused or unsupported
setting, it returns a warning string that says what failed and why, so the daemon
can log it and keep running (a slower loop beats no loop). Linux only; elsewhere
each setting reports itself unsupported.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import os
import sys

__all__ = [
    "describe_scheduling",
    "enable_realtime",
    "freeze_gc",
    "lock_all_memory",
    "set_fifo",
    "set_timer_slack",
]

# <sys/mman.h> values on x86, arm and riscv Linux (alpha/sparc/powerpc differ; not targets).
_MCL_CURRENT = 1
_MCL_FUTURE = 2
_PR_SET_TIMERSLACK = 29

_HINTS = {
    errno.EPERM: "run with CAP_SYS_NICE or LimitRTPRIO=<prio> (systemd) / ulimit -r",
    errno.EINVAL: "the priority is outside the kernel's SCHED_FIFO range",
}
_MLOCK_HINTS = {
    errno.ENOMEM: "RLIMIT_MEMLOCK too small: LimitMEMLOCK=infinity (systemd) / ulimit -l",
    errno.EPERM: "needs CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK",
    errno.EAGAIN: "some memory could not be locked",
}


def _errname(code: int) -> str:
    return errno.errorcode.get(code, str(code))


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def set_fifo(priority: int) -> str | None:
    """Put the calling thread under SCHED_FIFO at ``priority``; a warning or None.

    On Linux pid 0 means the calling thread, so call this from the loop thread.
    ``priority`` 0 means "leave the scheduler alone" (no warning).
    """
    if isinstance(priority, bool) or not isinstance(priority, int):
        return f"SCHED_FIFO: priority must be an int, got {priority!r}; not changed"
    if priority == 0:
        return None
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_FIFO"):
        return f"SCHED_FIFO {priority} not supported on {sys.platform}"
    low = os.sched_get_priority_min(os.SCHED_FIFO)
    high = os.sched_get_priority_max(os.SCHED_FIFO)
    if not low <= priority <= high:
        return f"SCHED_FIFO {priority} out of range {low}..{high}; scheduler not changed"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as exc:
        code = exc.errno or 0
        why = "not permitted" if code == errno.EPERM else "failed"
        hint = _HINTS.get(code, exc.strerror or "")
        return f"SCHED_FIFO {priority} {why} ({_errname(code)}): {hint}"
    return None


def lock_all_memory() -> str | None:
    """mlockall(MCL_CURRENT | MCL_FUTURE) so no page of the process is ever swapped out.

    MCL_FUTURE also locks every later mapping (thread stacks, numpy buffers), so the
    process's resident size grows to its mapped size: keep the control process lean.
    """
    libc = _libc()
    if libc is None:
        return f"mlockall not supported on {sys.platform}"
    if libc.mlockall(_MCL_CURRENT | _MCL_FUTURE) != 0:
        code = ctypes.get_errno()
        return f"mlockall failed ({_errname(code)}): {_MLOCK_HINTS.get(code, os.strerror(code))}"
    return None


def set_timer_slack(ns: int) -> str | None:
    """prctl(PR_SET_TIMERSLACK, ns) for the calling thread; a warning or None.

    The default slack is 50 µs: the kernel may fire a sleeping thread's timer that much
    late to batch wake-ups. ``ns`` must be >= 1 (the kernel reads 0 as "reset to the
    default"). SCHED_FIFO threads have no slack anyway; this helps when FIFO is refused.
    """
    if isinstance(ns, bool) or not isinstance(ns, int) or ns < 1:
        return f"timer slack: ns must be an int >= 1, got {ns!r}; not changed"
    libc = _libc()
    if libc is None:
        return f"timer slack not supported on {sys.platform}"
    if libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0) != 0:
        code = ctypes.get_errno()
        return f"timer slack {ns} ns failed ({_errname(code)}): {os.strerror(code)}"
    return None


def enable_realtime(priority: int, lock_memory: bool, *, timer_slack_ns: int = 1) -> list[str]:
    """Apply the control process's realtime settings; return warnings, never raise.

    - ``priority`` > 0: SCHED_FIFO at that priority for the calling thread (0 = don't).
    - ``lock_memory``: mlockall(MCL_CURRENT | MCL_FUTURE).
    - ``timer_slack_ns``: the calling thread's timer slack (0 = leave it alone).
    """
    warnings: list[str] = []
    for warning in (
        set_fifo(priority),
        lock_all_memory() if lock_memory else None,
        set_timer_slack(timer_slack_ns) if timer_slack_ns else None,
    ):
        if warning:
            warnings.append(warning)
    return warnings


def freeze_gc() -> int:
    """Collect once, then move every surviving object to the permanent generation.

    Call after start-up, just before the loop. One automatic gen-2 collection paused a
    loop 62 ms; after gc.freeze() none happened, because the collector no longer scans
    the start-up heap. The thresholds are deliberately left at their defaults: the loop
    allocates little, so gen-0 collections are rare and short, and disabling the
    collector would let reference cycles leak for the whole life of the daemon.
    Returns the number of objects frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def describe_scheduling() -> str:
    """The calling thread's policy and priority, e.g. ``"SCHED_FIFO 80"`` (for reports)."""
    if not hasattr(os, "sched_getscheduler"):
        return "unknown"
    try:
        policy = os.sched_getscheduler(0)
        prio = os.sched_getparam(0).sched_priority
    except OSError as exc:
        return f"unknown ({_errname(exc.errno or 0)})"
    names = {
        getattr(os, n): n
        for n in ("SCHED_OTHER", "SCHED_FIFO", "SCHED_RR", "SCHED_BATCH", "SCHED_IDLE")
        if hasattr(os, n)
    }
    return f"{names.get(policy, str(policy))} {prio}"
