"""The daemon's own terminal: the status line names a fault's cause, log lines are
written above it and never into it, and without a terminal there is no status line."""

from __future__ import annotations

import io
import logging
import os
import re
import select
import signal
import subprocess
import sys
import time

from robotd.operator.client import ControlClient
from robotd.operator.status import CLEAR, LineKeepingHandler, format_status
from tests.daemon_util import REPO

LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING|ERROR)")


def shown_lines(text: str) -> list[str]:
    """What a terminal shows: each line as left after its last clear-line."""
    return [line.split(CLEAR)[-1].replace("\r", "") for line in text.split("\n")]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_status_line_names_the_fault_cause():
    state = {"state": "FAULT", "fault": {"cause": "estop", "detail": "bench", "active": False}}
    line = format_status({}, state, 30.0, 120.0)
    assert line.startswith("FAULT e-stop: bench (clear_fault to leave) |")
    driver = {"state": "FAULT", "fault": {"cause": "driver", "detail": "3 failed", "active": True}}
    assert "joint driver fault: 3 failed (still present" in format_status({}, driver, 0, 0)


def test_a_log_record_is_written_above_the_status_line():
    stream = _Tty()
    handler = LineKeepingHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("test.status")
    log.propagate = False
    log.addHandler(handler)
    try:
        handler.draw("RUNNING ep 1 step 5 | status")
        log.warning("shield 4 clipped")
        handler.draw("RUNNING ep 1 step 6 | status")
        log.warning("a second record")
    finally:
        log.removeHandler(handler)
    assert shown_lines(stream.getvalue()) == [
        "shield 4 clipped",
        "a second record",
        "RUNNING ep 1 step 6 | status",
    ]


def test_no_status_line_without_a_terminal(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "robotd", "run", "--duration", "2",
         "--set", f'runtime.dir="{tmp_path}/run"', "--set", f'trace.dir="{tmp_path}/traces"'],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert " Hz p99 " not in out.stderr + out.stdout and CLEAR not in out.stderr


def _read_until(master: int, buf: bytearray, pattern: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, buf.decode(errors="replace")):
        left = deadline - time.monotonic()
        assert left > 0, f"no {pattern!r} on the terminal:\n{buf.decode(errors='replace')[-3000:]}"
        ready, _, _ = select.select([master], [], [], min(left, 0.5))
        if ready:
            buf += os.read(master, 65536)


def test_on_a_terminal_logs_and_the_status_line_never_share_a_line(tmp_path):
    master, slave = os.openpty()
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "robotd", "run", "--set", 'robot.start="latched"',
         "--set", f'runtime.dir="{run}"', "--set", f'trace.dir="{tmp_path}/traces"'],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
    )  # fmt: skip
    os.close(slave)
    buf = bytearray()
    try:
        _read_until(master, buf, r"Hz p99")
        client = ControlClient(f"ipc://{run}/control.sock", timeout_s=15)
        try:
            for _ in range(3):  # log lines while the status line is redrawn
                client.request("clear_fault")
                client.request("estop", {"reason": "pty test"})
        finally:
            client.close()
        _read_until(master, buf, r"FAULT e-stop: pty test \(clear_fault to leave\) \|")
        _read_until(master, buf, r"operator: estop reason='pty test'")
        text = buf.decode(errors="replace")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        os.close(master)
    shown = shown_lines(text)
    assert any(LOG_LINE.search(line) for line in shown)
    for line in shown:
        # every process on the terminal (the worker, its copies, the control lane, the
        # cameras) starts its lines by clearing the line: none runs on after the status
        assert not (" Hz p99 " in line and (LOG_LINE.search(line) or "control: " in line)), line


def test_a_child_process_line_on_a_terminal_clears_the_status_line_first():
    """The daemon's children share its terminal: each of their log lines begins by clearing
    the line, so one written while the status line is shown replaces it instead of running
    on after it; off a terminal (journald, a pipe) no escape is written."""
    code = (
        "import logging; from robotd.runtime.procutil import setup_logging; "
        "setup_logging(); logging.getLogger('robotd.worker').info('from a child')"
    )
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stderr=slave)
    os.close(slave)
    buf = bytearray()
    try:
        _read_until(master, buf, r"from a child")
    finally:
        proc.wait(30)
        os.close(master)
    assert buf.decode().startswith(CLEAR)
    piped = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                           text=True, check=True)  # fmt: skip
    assert "from a child" in piped.stderr and "\x1b" not in piped.stderr
