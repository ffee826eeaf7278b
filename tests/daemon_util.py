"""Run the real daemon as a subprocess and wait on what it logs (no sleeps as synchronisation)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Daemon:
    """`python -m robotd run ...` with its stderr read line by line on a thread.

    Every daemon a test starts is killed (with its process group) when the test ends, by
    tests/conftest.py, so a failing test never leaves one behind for the next."""

    started: list[Daemon] = []

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.dir = tmp / "run"
        self.traces = tmp / "traces"  # the trace's runs (never the repo's runs/)
        self.summary = tmp / "summary.json"
        argv = [
            sys.executable,
            "-m",
            "robotd",
            "run",
            "--no-status",
            "--summary",
            str(self.summary),
            "--set",
            f'runtime.dir="{self.dir}"',
            "--set",
            f'trace.dir="{self.traces}"',
            *args,
        ]
        full_env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            start_new_session=True,
        )
        Daemon.started.append(self)
        # each line with when this thread read it (monotonic): the reader blocks on the pipe,
        # so that is when the line was written, whenever the test gets round to it
        self.lines: queue.Queue[tuple[str, float]] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            self.lines.put((line, time.monotonic()))
        self.lines.put(("", time.monotonic()))  # EOF marker

    def wait_line(self, pattern: str, timeout: float = 30.0) -> str:
        return self.wait_line_at(pattern, timeout)[0]

    def wait_line_at(self, pattern: str, timeout: float = 30.0) -> tuple[str, float]:
        """The next line matching `pattern`, and when it was read off the pipe."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"no line matching {pattern!r} within {timeout} s:\n" + "".join(self.log[-40:])
                )
            try:
                line, at = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line == "":
                raise AssertionError(
                    f"daemon exited before {pattern!r}:\n" + "".join(self.log[-40:])
                )
            if rx.search(line):
                return line, at

    def wait_eof(self, timeout: float = 30.0) -> list[str]:
        """The whole log, once every process writing to it has closed it (the daemon's
        children share its stderr)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the log stayed open:\n" + "".join(self.log[-40:]))
            try:
                if self.lines.get(timeout=left)[0] == "":
                    return list(self.log)
            except queue.Empty:
                continue

    def wait_exit(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("daemon did not exit:\n" + "".join(self.log[-40:])) from None

    @classmethod
    def kill_all(cls, since: int = 0) -> None:
        """Kill every daemon started (after the first `since`) and still running, with its
        process group."""
        while len(cls.started) > since:
            daemon = cls.started.pop()
            if daemon.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(daemon.proc.pid, signal.SIGKILL)
                daemon.proc.wait(10)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def result(self) -> dict:
        return json.loads(self.summary.read_text())

    @property
    def control_endpoint(self) -> str:
        return f"ipc://{self.dir}/control.sock"


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().split()[2]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def lane_pid(daemon: Daemon) -> int:
    """The daemon's control lane process (its command line carries the run dir)."""
    (pid,) = [
        p
        for p in processes_mentioning(str(daemon.dir))
        if b"robotd.control.process" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    return pid


def wait_until(cond, timeout: float, what: str) -> None:
    """Poll a condition that has no event to wait on (process exit seen through /proc)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def shm_of(pid: int) -> list[Path]:
    return list(Path("/dev/shm").glob(f"robotd-{pid}-*"))


__all__ = ["Daemon", "lane_pid", "processes_mentioning", "shm_of", "signal", "wait_until"]
