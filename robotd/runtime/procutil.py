"""Small helpers that every robotd child process uses: dying with the parent,
stopping on SIGTERM/SIGINT, interruptible absolute sleeps, one-line errors.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_stop_event: threading.Event | None = None


PARENT_ENV = "ROBOTD_PARENT_PID"


def die_with_parent(
    expected_parent: int | None = None, sig: signal.Signals = signal.SIGTERM
) -> bool:
    """Have the kernel send this process `sig` (SIGTERM) when its parent dies (Linux prctl).

    Returns False (and does nothing) where unsupported. If `expected_parent` is given
    and the parent is already someone else (it died before we asked), `sig` is sent
    to ourselves right away. Note: the signal comes when the parent *thread* that
    spawned us exits, so parents should spawn children from a long-lived thread.
    """
    if not sys.platform.startswith("linux"):
        return False
    if expected_parent is None:
        # Set by robotd's supervisor for its children, so a parent that died between fork and
        # here is noticed too.
        env = os.environ.get(PARENT_ENV, "")
        expected_parent = int(env) if env.isdigit() else None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.prctl(
            ctypes.c_int(PR_SET_PDEATHSIG),
            ctypes.c_ulong(sig),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        )
    except (OSError, AttributeError):
        return False
    if rc != 0:
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
    return True


def install_stop_signals(
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
) -> threading.Event:
    """Make SIGTERM and SIGINT set the returned event (instead of killing or raising).

    Call from the main thread. The handler only writes a byte to a pipe; a helper
    thread sets the event. (Setting a threading.Event from inside a signal handler
    can deadlock if the main thread was inside that event's wait() at the time.)
    Calling again returns the same event.
    """
    global _stop_event
    if _stop_event is not None:
        return _stop_event
    _stop_event = signal_event(signals)
    return _stop_event


def signal_event(signals: tuple[signal.Signals, ...]) -> threading.Event:
    """An event set whenever one of `signals` arrives (call from the main thread; see
    install_stop_signals for why a pipe and a thread, not the handler, set it)."""
    event = threading.Event()
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def handler(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):  # pipe full: a stop is already pending
            os.write(write_fd, b"!")

    def watch() -> None:
        while os.read(read_fd, 64):
            event.set()

    threading.Thread(target=watch, name="signals", daemon=True).start()
    for signum in signals:
        signal.signal(signum, handler)
    return event


def sleep_until(
    deadline_ns: int, stop: threading.Event | None = None, chunk_s: float = 0.05
) -> bool:
    """Sleep until time.monotonic_ns() >= deadline_ns, waking every chunk_s to check `stop`.

    Returns True at the deadline, False early if `stop` is set. The last slice is
    one time.sleep to the deadline, which keeps it to tens of microseconds.
    """
    while True:
        if stop is not None and stop.is_set():
            return False
        remaining = (deadline_ns - time.monotonic_ns()) / 1e9
        if remaining <= 0:
            return True
        time.sleep(min(remaining, chunk_s))


def line_start() -> str:
    """What each log line on stderr starts with: on a terminal, carriage return and erase
    line, so that a child's line written while the daemon's status line is shown replaces
    it (the daemon redraws it below) instead of running on after it; nothing elsewhere
    (journald, a pipe, a file)."""
    try:
        return "\r\x1b[2K" if sys.stderr is not None and sys.stderr.isatty() else ""
    except (OSError, ValueError):  # a closed stderr
        return ""


def setup_logging(verbose: bool = False) -> None:
    """Log lines on stderr, one a record, with time, level and logger."""
    import logging

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=line_start() + "%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


async def stop_on_signal(stop: Callable[[], None]) -> None:
    """Call `stop` at the first SIGINT or SIGTERM (in an anyio task), saying so."""
    import logging

    import anyio

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            logging.getLogger("robotd").info(
                "%s: stopping (the robot holds)", signal.Signals(signum).name
            )
            stop()
            return
