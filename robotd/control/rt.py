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
    "small_thread_stacks",
    "unlock_idle_reservations",
]

# <sys/mman.h> values on x86, arm and riscv Linux (alpha/sparc/powerpc differ; not targets).
_MCL_CURRENT = 1
_MCL_FUTURE = 2
_MCL_ONFAULT = 4  # Linux 4.4+: lock pages as they are touched, not the whole mapping
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
    """mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) so no page the process uses is
    ever swapped out.

    MCL_ONFAULT locks pages as they are first touched: without it every mapping is faulted
    in whole (numpy/OpenBLAS's 64 MiB buffer, each thread's 8 MiB stack), so the process
    would hold its mapped size resident. Kernels before 4.4 refuse the flag (EINVAL): then
    the whole mappings are locked, with a warning saying so.
    """
    libc = _libc()
    if libc is None:
        return f"mlockall not supported on {sys.platform}"
    if libc.mlockall(_MCL_CURRENT | _MCL_FUTURE | _MCL_ONFAULT) == 0:
        return None
    code = ctypes.get_errno()
    if code == errno.EINVAL and libc.mlockall(_MCL_CURRENT | _MCL_FUTURE) == 0:
        return "mlockall: this kernel has no MCL_ONFAULT; every mapping is locked whole"
    code = ctypes.get_errno() if code == errno.EINVAL else code
    return f"mlockall failed ({_errname(code)}): {_MLOCK_HINTS.get(code, os.strerror(code))}"


def small_thread_stacks(size: int = 512 * 1024) -> str | None:
    """Make threads started from now on (Python's and native ones, e.g. ZeroMQ's I/O
    thread) reserve `size` bytes of stack instead of RLIMIT_STACK's 8 MiB: under mlockall
    every stack counts whole against the locked memory. A warning or None."""
    import threading

    threading.stack_size(size)
    libc = _libc()
    if libc is None or not hasattr(libc, "pthread_setattr_default_np"):
        return "thread stacks: pthread_setattr_default_np unavailable; native threads keep 8 MiB"
    attr = ctypes.create_string_buffer(256)  # >= sizeof(pthread_attr_t) on every Linux ABI
    ok = (
        libc.pthread_attr_init(attr) == 0
        and libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(size)) == 0
        and libc.pthread_setattr_default_np(attr) == 0
    )
    libc.pthread_attr_destroy(attr)
    return None if ok else "thread stacks: could not set the default native stack size"


def unlock_idle_reservations(min_bytes: int = 16 << 20) -> int:
    """munlock the large anonymous mappings nothing has touched yet (no resident page):
    reservations such as the BLAS buffer numpy maps at import, which the control loop
    never uses. They would otherwise count whole against RLIMIT_MEMLOCK. Returns the
    bytes left unlocked. Call after lock_all_memory, once start-up is done."""
    libc = _libc()
    if libc is None:
        return 0
    freed = 0
    try:
        with open(f"/proc/{os.getpid()}/smaps") as f:
            text = f.read()
    except OSError:
        return 0
    start = end = 0
    anonymous = False
    size = 0
    for line in text.splitlines():
        head = line.split(maxsplit=6)
        if head and "-" in head[0] and not head[0].endswith(":"):
            lo, _, hi = head[0].partition("-")
            start, end = int(lo, 16), int(hi, 16)
            anonymous = len(head) < 6
            size = end - start
        elif (
            head
            and head[0] == "Rss:"
            and anonymous
            and size >= min_bytes
            and head[1] == "0"
            and libc.munlock(ctypes.c_void_p(start), ctypes.c_size_t(size)) == 0
        ):
            freed += size
    return freed


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
    locked = lock_all_memory() if lock_memory else "not asked"
    if lock_memory and locked is None:
        unlock_idle_reservations()
    for warning in (
        set_fifo(priority),
        locked if lock_memory else None,
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
