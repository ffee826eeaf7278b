"""systemd notification (Type=notify): READY, STATUS, STOPPING and a watchdog that
pets only while the control loop's tick counter advances.

Written by hand: the protocol is one datagram to $NOTIFY_SOCKET, and the packages
that wrap it (sdnotify, systemd-python) add either nothing or a C build.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import anyio

_ticks = 0


def notify(*fields: str) -> bool:
    """Send `fields` (e.g. "READY=1") to systemd; False when not run under systemd."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto("\n".join(fields).encode(), path)
        except OSError:
            return False
    return True


def tick_progress(ticks: int) -> None:
    """Record the control lane's tick counter (from its stats messages)."""
    global _ticks
    _ticks = ticks


def watchdog_interval() -> float | None:
    """Half of WATCHDOG_USEC, when systemd asked for a watchdog for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6


async def watchdog_loop(state: Callable[[], str]) -> None:
    """Pet the watchdog only while ticks advance: a stuck control lane gets us restarted."""
    interval = watchdog_interval()
    last = -1
    while True:
        await anyio.sleep(interval or 2.0)
        ticks = _ticks
        if ticks != last:
            fields = [f"STATUS={state()} ticks={ticks}"]
            if interval:
                fields.append("WATCHDOG=1")
            notify(*fields)
        last = ticks
