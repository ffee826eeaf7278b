"""The supervisor's restarts back off: a child that dies at once on every start waits the
first delay, then twice that, up to the cap, and the warning says the delay and how many
restarts in a row; a child that stayed up starts the backoff over. Real processes; the
delays are the test's (short), and the test waits on its own events, never on sleeps."""

from __future__ import annotations

import logging
import sys
import time

import anyio
import pytest

from robotd.backoff import Backoff, ordinal
from robotd.exits import exit_words
from robotd.runtime.supervisor import Child, Supervisor

DEADLINE_S = 120.0  # generous: a loaded 2-core machine starts processes slowly
QUICK = ["/bin/sh", "-c", "exit 3"]  # a real process that dies at once
LOG = "robotd.runtime.supervisor"


class Exits:
    """The child's exits as the supervisor reports them; restarts until `stop_after`."""

    def __init__(self, stop_after: int, argv_after: dict[int, list[str]] | None = None) -> None:
        self.stop_after = stop_after
        self.argv_after = argv_after or {}
        self.codes: list[int] = []
        self.spawned: list[float] = []  # monotonic times the child was (re)started
        self.exited: list[float] = []
        self.done = anyio.Event()

    async def on_exit(self, child: Child, code: int) -> bool:
        self.spawned.append(child.started_at)
        self.exited.append(time.monotonic())
        self.codes.append(code)
        if len(self.codes) in self.argv_after:
            child.argv = self.argv_after[len(self.codes)]
        if len(self.codes) >= self.stop_after:
            self.done.set()
            return False
        return True


async def _supervise(child: Child, exits: Exits) -> None:
    async with anyio.create_task_group() as tg:
        sup = Supervisor(tg)
        await sup.start(child)
        with anyio.fail_after(DEADLINE_S):
            await exits.done.wait()
        await sup.stop_all(grace_s=5.0)
        tg.cancel_scope.cancel()


def _restart_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG and "restarting" in r.message]


def test_a_child_that_dies_at_once_is_restarted_ever_more_rarely(caplog) -> None:
    caplog.set_level(logging.WARNING, LOG)
    exits = Exits(stop_after=6)
    child = Child("camera:bad", QUICK, exits.on_exit, restart_delay_s=0.05, restart_max_s=0.4,
                  stable_s=60.0)
    anyio.run(_supervise, child, exits)
    assert exits.codes == [3] * 6 and child.restarts == 5
    want = [0.05, 0.1, 0.2, 0.4, 0.4]  # doubling, then the cap
    lines = _restart_lines(caplog)
    assert len(lines) == 5, lines
    for n, (line, delay) in enumerate(zip(lines, want, strict=True), start=1):
        assert line.startswith("camera:bad exited with code 3 after "), line
        assert line.endswith(f": restarting in {delay:g} s, {ordinal(n)} restart in a row"), line
    # each restart really waited its delay after the exit before it
    for i, delay in enumerate(want):
        assert exits.spawned[i + 1] - exits.exited[i] >= delay * 0.99, (i, exits.spawned)
    last = [r.getMessage() for r in caplog.records if r.name == LOG][-1]
    assert "restarting" not in last and "exited with code 3" in last  # not restarted


def test_a_child_that_stayed_up_starts_the_backoff_over(caplog) -> None:
    caplog.set_level(logging.WARNING, LOG)
    # exits 1 and 2 at once; the third run lives well past stable_s; then at once again
    lasting = [sys.executable, "-c", "import time; time.sleep(2.0); raise SystemExit(4)"]
    exits = Exits(stop_after=5, argv_after={2: lasting, 3: QUICK})
    child = Child("worker", QUICK, exits.on_exit, restart_delay_s=0.05, restart_max_s=0.4,
                  stable_s=1.0)
    anyio.run(_supervise, child, exits)
    assert exits.codes == [3, 3, 4, 3, 3]
    tails = [line.rsplit(": ", 1)[1] for line in _restart_lines(caplog)]
    assert tails == [
        "restarting in 0.05 s, 1st restart in a row",
        "restarting in 0.1 s, 2nd restart in a row",
        "restarting in 0.05 s, 1st restart in a row",  # it had stayed up 2 s: over again
        "restarting in 0.1 s, 2nd restart in a row",
    ]


def test_a_child_not_restarted_by_its_handler_is_left_alone(caplog) -> None:
    caplog.set_level(logging.WARNING, LOG)
    exits = Exits(stop_after=1)
    child = Child("control", QUICK, exits.on_exit, restart_delay_s=0.05)
    anyio.run(_supervise, child, exits)
    assert exits.codes == [3] and child.restarts == 0 and not _restart_lines(caplog)


def test_the_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(1.0, 30.0)
    assert [b.next() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30] and b.in_a_row == 7
    b.reset()
    assert (b.next(), b.in_a_row) == (1.0, 1)
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


class _StopDuringRestart(Supervisor):
    """stop_all running while open_process starts a restarted child: the window is an await
    inside anyio, so the test puts stop_all there itself (a seam, not a mock: the processes
    are real)."""

    stopped = anyio.Event()

    async def _spawn(self, child: Child) -> None:
        if child.restarts:
            await self.stop_all(grace_s=5.0)
        await super()._spawn(child)
        if child.restarts:
            self.stopped.set()  # the restarted process is child.process from here on


def test_a_child_restarted_while_the_supervisor_stops_is_stopped_too() -> None:
    long_lived = [sys.executable, "-c", "import time; time.sleep(600)"]
    child = Child("raced", QUICK, restart_delay_s=0.01, restart_max_s=0.01)

    async def on_exit(c: Child, code: int) -> bool:
        c.argv = long_lived  # the restart would live for ten minutes if nobody stopped it
        return True

    child.on_exit = on_exit

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            sup = _StopDuringRestart(tg)
            await sup.start(child)
            with anyio.fail_after(DEADLINE_S / 2):
                await sup.stopped.wait()
                assert child.process is not None
                # stopped by the supervisor while it still runs, not left for ten minutes
                await child.process.wait()
                assert child.process.returncode is not None
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert child.argv == long_lived and child.restarts == 1


def test_an_exit_is_one_line_saying_what_it_means_and_what_comes_next(caplog) -> None:
    # what the handler says the exit means goes in the supervisor's one line (an error),
    # not in a second line of its own
    caplog.set_level(logging.WARNING, LOG)
    exits = Exits(stop_after=2)

    async def on_exit(child: Child, code: int) -> bool:
        child.said = "its frames go stale, no act is asked"
        return await exits.on_exit(child, code)

    child = Child("camera:top", QUICK, on_exit, restart_delay_s=0.05, restart_max_s=0.4)
    anyio.run(_supervise, child, exits)
    records = [r for r in caplog.records if r.name == LOG]
    assert [r.getMessage().split(" after ")[0] for r in records] == [
        "camera:top exited with code 3"] * 2, [r.getMessage() for r in records]
    first, last = (r.getMessage() for r in records)
    assert first.endswith(": its frames go stale, no act is asked; restarting in 0.05 s, 1st "
                          "restart in a row"), first
    assert last.endswith(": its frames go stale, no act is asked"), last  # not restarted
    assert {r.levelno for r in records} == {logging.ERROR}


def test_a_child_killed_by_a_signal_is_said_to_be_by_the_signals_name(caplog) -> None:
    # the worker's copies say "killed by SIGKILL"; the supervisor said "exited with code -9"
    caplog.set_level(logging.WARNING, LOG)
    exits = Exits(stop_after=2)
    killed = ["/bin/sh", "-c", "kill -KILL $$"]  # a real process, really killed
    child = Child("camera:top", killed, exits.on_exit, restart_delay_s=0.05)
    anyio.run(_supervise, child, exits)
    assert exits.codes == [-9, -9]
    lines = [r.getMessage() for r in caplog.records if r.name == LOG]
    assert [line.split(" after ")[0] for line in lines] == ["camera:top killed by SIGKILL"] * 2


def test_exit_words() -> None:
    assert exit_words(0) == "exited with code 0" and exit_words(3) == "exited with code 3"
    assert exit_words(-9) == "killed by SIGKILL" and exit_words(-11) == "killed by SIGSEGV"
    assert exit_words(-200) == "killed by signal 200"  # no name: its number
