"""The run directory's sockets and pid file, watched while the daemon runs.

Operators reach the daemon only through its socket files (control.sock, telemetry.sock) and
the control lane through lane.sock, by path. A run directory removed under a running
daemon (an $XDG_RUNTIME_DIR removed at logout, a cleaner of /tmp, a mistaken rm) takes
them away: the sockets still serve whoever is connected, but nobody new can reach the
robot, not even `robotctl estop`; and without its pid file a second daemon could start
there and open the same robot. Nothing else would notice: the watch looks once a
WATCH_S and tells the daemon, which e-stops the robot and stops (robotd.runtime.daemon).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

WATCH_S = 1.0


def _ident(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


_MISSING = (-1, -1)  # a file already gone when it was to be watched: lost at the first look


class SocketWatch:
    """The files as they were when taken (`paths`: sockets bound by now, the pid file); more
    are added as they are bound (`add`). One already missing when taken counts as lost."""

    def __init__(self, paths: list[Path], held: dict[Path, int] | None = None) -> None:
        """`held`: files known by a descriptor held open (the locked pid file), judged
        against that file itself, however long ago it was opened."""
        self.known: list[tuple[Path, tuple[int, int]]] = []
        self.add(paths)
        for path, fd in (held or {}).items():
            st = os.fstat(fd)
            self.known.append((path, (st.st_dev, st.st_ino)))

    def add(self, paths: list[Path]) -> None:
        """Watch `paths` too, as they are now (just bound)."""
        self.known += [(p, _ident(p) or _MISSING) for p in paths]

    def lost(self) -> list[str]:
        """'control.sock (gone)', 'lane.sock (replaced)': each no longer the file taken."""
        out = []
        for path, ident in self.known:
            now = _ident(path)
            if now != ident:
                out.append(f"{path.name} ({'gone' if now is None else 'replaced'})")
        return out


async def watch_sockets(
    watch: SocketWatch, on_lost: Callable[[list[str]], Awaitable[None]]
) -> None:
    """Look every WATCH_S; the first time a socket file is lost, await `on_lost` and end."""
    while True:
        await anyio.sleep(WATCH_S)
        if lost := watch.lost():
            await on_lost(lost)
            return
