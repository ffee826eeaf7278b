"""Child processes of the main process: start, watch, restart, and stop them all.

Every child dies with its parent (PR_SET_PDEATHSIG, set by the child itself), so a
killed main process leaves nothing behind; on a clean stop the supervisor sends
SIGTERM, waits a grace period, then SIGKILLs what is left.

A child its `on_exit` restarts is restarted after a delay that backs off (robotd.backoff):
1 s, doubling to 30 s while it keeps dying young, back to 1 s once it has stayed up
`stable_s` (the cap, by default). One that dies at once on every start (a bad device, a
crash on import) is then restarted, and logged, every 30 s, not every second forever.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import anyio
from anyio.abc import Process

from robotd.backoff import FIRST_S, MAX_S, Backoff, ordinal
from robotd.exits import exit_words
from robotd.runtime.procutil import PARENT_ENV

log = logging.getLogger("robotd.runtime.supervisor")

ExitHandler = Callable[["Child", int], Awaitable[bool]]


@dataclass
class Child:
    """One supervised process: `argv` to start it, `on_exit` decides whether to restart.
    Restarts wait `restart_delay_s`, doubling to `restart_max_s` while the child keeps
    exiting within `stable_s` of its start (None: `restart_max_s`)."""

    name: str
    argv: Sequence[str]
    on_exit: ExitHandler | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # on top of this process's
    pass_fds: tuple[int, ...] = ()  # descriptors it inherits (the others close at exec)
    restart_delay_s: float = FIRST_S
    restart_max_s: float = MAX_S
    stable_s: float | None = None
    process: Process | None = None
    restarts: int = 0
    started_at: float = 0.0  # monotonic, at the last spawn
    said: str = ""  # on_exit's words for what this exit means, logged with it
    exited: anyio.Event = field(default_factory=anyio.Event)
    backoff: Backoff = field(init=False)

    def __post_init__(self) -> None:
        self.backoff = Backoff(self.restart_delay_s, self.restart_max_s)

    def restart_delay(self, up_s: float) -> float:
        """The wait before restarting a child that was up `up_s`: the backoff starts over
        after a run that lasted."""
        stable = self.restart_max_s if self.stable_s is None else self.stable_s
        if up_s >= stable:
            self.backoff.reset()
        return self.backoff.next()


class Supervisor:
    """Starts children and watches them inside the caller's task group."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg
        self.children: dict[str, Child] = {}
        self.stopping = False
        self.grace_s = 5.0  # stop_all's, for a child whose restart it raced

    async def start(self, child: Child) -> Child:
        self.children[child.name] = child
        await self._spawn(child)
        self._tg.start_soon(self._watch, child)
        return child

    async def _spawn(self, child: Child) -> None:
        env = {**os.environ, **child.env, PARENT_ENV: str(os.getpid())}
        child.process = await anyio.open_process(
            list(child.argv), stdin=None, stdout=None, stderr=None, env=env,
            pass_fds=child.pass_fds,
        )
        child.exited = anyio.Event()
        child.started_at = time.monotonic()
        log.debug("started %s (pid %d)", child.name, child.process.pid)

    async def _watch(self, child: Child) -> None:
        while True:
            assert child.process is not None
            code = await child.process.wait()
            up_s = time.monotonic() - child.started_at
            child.exited.set()
            if self.stopping:
                return
            child.said = ""
            again = await child.on_exit(child, code) if child.on_exit else False
            # one line per exit: what it means (the handler's `said`), then what comes next
            level = logging.ERROR if child.said else logging.WARNING
            said = f": {child.said}" if child.said else ""
            ended = exit_words(code)  # "killed by SIGKILL" where the code is -9
            if not again or self.stopping:
                log.log(level, "%s %s after %.1f s%s", child.name, ended, up_s, said)
                return
            delay = child.restart_delay(up_s)
            log.log(
                level,
                "%s %s after %.1f s%s restarting in %g s, %s restart in a row",
                child.name, ended, up_s, f"{said};" if said else ":", delay,
                ordinal(child.backoff.in_a_row),
            )
            await anyio.sleep(delay)
            if self.stopping:
                return
            child.restarts += 1
            await self._spawn(child)
            if self.stopping:
                # stop_all ran while open_process was starting it: it was not among the
                # children it stopped, so this one is stopped here
                await self._stop_one(child, self.grace_s)
                return

    async def stop_all(self, grace_s: float = 5.0, first: Sequence[str] = ()) -> None:
        """SIGTERM every child (those named in `first` before the rest), SIGKILL after grace_s."""
        self.stopping = True
        self.grace_s = grace_s
        order = [c for n in first if (c := self.children.get(n))] + [
            c for n, c in self.children.items() if n not in first
        ]
        for child in order:
            await self._stop_one(child, grace_s)

    async def _stop_one(self, child: Child, grace_s: float) -> None:
        proc = child.process
        if proc is None or proc.returncode is not None:
            return
        try:
            proc.terminate()
        except ProcessLookupError:
            return
        with anyio.move_on_after(grace_s):
            await proc.wait()
            return
        log.warning("%s did not stop within %.1f s: killing it", child.name, grace_s)
        try:
            proc.kill()
        except ProcessLookupError:
            return
        with anyio.move_on_after(grace_s):
            await proc.wait()


def python_module(module: str, *args: str) -> list[str]:
    """argv running `python -m module args` with this interpreter."""
    return [sys.executable, "-m", module, *args]
