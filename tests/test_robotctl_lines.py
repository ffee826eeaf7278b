"""robotctl without a terminal: `watch` into a file or a pipe writes a line per update as
it happens (JSON lines with --json), not one screen when it exits; and `robotctl --help`
says what every subcommand does."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.daemon_util import REPO, Daemon
from tests.robotctl_util import robotctl

DEADLINE_S = 60.0  # a loaded 2-core machine starts Python slowly


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("lines"), "--set", 'robot.start="latched"')
    d.wait_line(r"operator socket")
    yield d
    d.signal()
    assert d.wait_exit() == 0


class PipedWatch:
    """`robotctl watch` with stdout on a pipe (no terminal), its lines read on a thread."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "robotd.operator.robotctl", "watch", *args],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            self.lines.put(text)
        self.lines.put("")  # EOF

    def next_line(self, timeout: float = DEADLINE_S) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                text = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line from watch within {timeout} s") from None
            if text == "":
                raise AssertionError("watch ended its output: " + self.proc.stderr.read())
            return text

    def close(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)


def test_watch_into_a_pipe_writes_a_line_per_update_while_it_runs(daemon):
    w = PipedWatch("--endpoint", daemon.control_endpoint, "--seconds", "600")
    try:
        first, second = w.next_line(), w.next_line()
        assert w.proc.poll() is None  # written as it happens, not when watch exits
    finally:
        assert w.close() == 0
    for text in (first, second):
        assert re.match(r"\d\d:\d\d:\d\d FAULT — started latched.*\| .* Hz ", text), text
        assert "\x1b" not in text and "[e] E-STOP" not in text  # no screen, no keys


def test_watch_json_writes_json_lines_of_the_telemetry(daemon):
    w = PipedWatch("--endpoint", daemon.control_endpoint, "--json", "--seconds", "600")
    try:
        first, second = json.loads(w.next_line()), json.loads(w.next_line())
        assert w.proc.poll() is None
    finally:
        assert w.close() == 0
    for got in (first, second):
        assert got["ok"] is True
        assert got["telemetry"]["state"]["state"] == "FAULT"
        assert got["telemetry"]["state"]["fault"]["cause"] == "startup"


def test_watch_json_without_a_daemon_says_so_once(tmp_path):
    w = PipedWatch("--endpoint", f"ipc://{tmp_path}/control.sock", "--json", "--seconds", "1")
    try:
        assert w.proc.wait(DEADLINE_S) == 0
    finally:
        w.close()
    out = [json.loads(w.next_line())]
    while (text := w.lines.get(timeout=DEADLINE_S)) != "":
        out.append(json.loads(text))
    assert len(out) == 1, out  # said when it became so, not at every redraw
    assert out[0]["ok"] is False and out[0]["error"]["code"] == "unreachable"
    assert "telemetry.sock does not exist" in out[0]["error"]["message"]


def test_watch_help_says_what_json_and_a_pipe_give():
    out, _ = robotctl("watch", "--help")
    assert out.returncode == 0
    flat = " ".join(out.stdout.split())
    assert "--json JSON lines on stdout: one object per telemetry update" in flat
    assert "When stdout is not a terminal (a file, a pipe), a line per update" in flat


def test_every_subcommand_says_what_it_does():
    out, _ = robotctl("--help")
    assert out.returncode == 0
    flat = " ".join(out.stdout.split())
    expected = {
        "status": "show the state",
        "stop": "end the running episode: RUNNING → ENDED",
        "estop": "emergency stop: latch FAULT",
        "clear_fault": "leave FAULT once its cause is gone: FAULT → IDLE",
        "reset_done": "the scene is reset after an episode: ENDED or RESETTING → IDLE",
        "stats": "show the run's counters",
        "start": "start an episode: IDLE → RUNNING",
        "params": "show (or set) parameters",
        "verdict": "judge the current episode",
        "watch": "live view",
        "keygen": "make a CURVE key pair",
    }
    for name, words in expected.items():
        assert f" {name} {words}" in flat, (name, out.stdout)
