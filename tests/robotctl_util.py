"""Run robotctl as a user would: a subprocess, or in a pseudo-terminal for `watch`; and the
daemon it talks to, as fixtures a test module takes in (`daemon = latched_daemon(...)` and
an imported `client`)."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator

import pytest

from robotd.operator.client import ControlClient
from tests.daemon_util import REPO, Daemon

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\r")


def latched_daemon(name: str) -> Callable[..., Iterator[Daemon]]:
    """A module-scoped `daemon` fixture: one real daemon for the module's tests, its robot
    latched (it never moves by itself), in a temporary directory named after `name`; it
    must stop cleanly (exit 0) on SIGTERM once the module is done."""

    @pytest.fixture(scope="module")
    def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
        d = Daemon(tmp_path_factory.mktemp(name), "--set", 'robot.start="latched"')
        d.wait_line(r"operator socket")
        yield d
        d.signal()
        assert d.wait_exit() == 0

    return daemon


@pytest.fixture
def client(daemon: Daemon) -> Iterator[ControlClient]:
    """A control client to the module's `daemon`, closed after the test."""
    c = ControlClient(daemon.control_endpoint, timeout_s=15)  # generous: CI machines are loaded
    yield c
    c.close()


def robotctl(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    """(completed process, seconds it took)."""
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "robotd.operator.robotctl", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return out, time.monotonic() - start


class PtyWatch:
    """`robotctl watch` on a pseudo-terminal of 120×40; read its screen, press keys."""

    def __init__(self, *args: str) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
        env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "robotd.operator.robotctl", "watch", *args],
            cwd=REPO,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        os.close(slave)
        self.master = master
        self.raw = b""

    def text(self) -> str:
        return ANSI.sub("", self.raw.decode(errors="replace"))

    def read_until(self, pattern: str, timeout: float = 30.0, *, after: int = 0) -> str:
        """Wait for `pattern` in the output after character `after` of the plain text."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = rx.search(self.text(), after)
            if found:
                return found.group(0)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"no {pattern!r} on screen within {timeout} s:\n{self.text()[-3000:]}"
                )
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    self.raw += os.read(self.master, 65536)
                except OSError:  # the process is gone and the pty closed
                    if self.proc.poll() is not None:
                        raise AssertionError(
                            f"watch exited before {pattern!r}:\n{self.text()[-3000:]}"
                        ) from None

    def press(self, key: str) -> None:
        os.write(self.master, key.encode())

    def interrupt(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)

    def close(self) -> int:
        """Press q and wait for the exit, reading the screen meanwhile: a watch whose
        output nobody reads blocks on its terminal and could never see the key."""
        if self.proc.poll() is None:
            self.press("q")
        deadline = time.monotonic() + 20
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._drain(0.1)
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait(5)
        self._drain(0.1)
        os.close(self.master)
        return code

    def _drain(self, wait_s: float) -> None:
        """Read what the watch wrote, until nothing more comes within `wait_s`."""
        try:
            while select.select([self.master], [], [], wait_s)[0]:
                data = os.read(self.master, 65536)
                if not data:
                    return
                self.raw += data
        except OSError:  # the process is gone and the pty closed
            pass
