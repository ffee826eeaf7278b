"""The daemon speaks sd_notify: READY, STOPPING, a watchdog petted only while it ticks.
(The unit file itself: tests/test_unit.py.)"""

from __future__ import annotations

import socket
from pathlib import Path

from robotd.runtime import sdnotify
from tests.daemon_util import Daemon


def test_notify_reaches_the_socket(tmp_path, monkeypatch):
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sdnotify.notify("READY=1", "STATUS=ok")
        assert sock.recv(1024) == b"READY=1\nSTATUS=ok"


def test_daemon_notifies_ready_then_stopping(tmp_path):
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(30)
        d = Daemon(tmp_path, "--duration", "2", env={"NOTIFY_SOCKET": str(path)})
        messages = []
        while not any("STOPPING=1" in m for m in messages):
            messages.append(sock.recv(1024).decode())
        assert d.wait_exit() == 0
    ready = next(i for i, m in enumerate(messages) if "READY=1" in m)
    stopping = next(i for i, m in enumerate(messages) if "STOPPING=1" in m)
    assert ready < stopping
    # READY once the loop ticks, saying what start-up still waits for; then running
    waits = "(waiting up to 30 s for the local worker, robotd.demo:DotFollower to answer hello)"
    assert "STATUS=" in messages[ready] and waits in messages[ready], messages[ready]
    running = next(i for i, m in enumerate(messages) if "STATUS=running at 30 Hz" in m)
    assert ready < running < stopping, messages


def test_watchdog_interval_is_half_of_watchdog_usec(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "5000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval() == 2.5
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert sdnotify.watchdog_interval() is None


def test_watchdog_is_petted_only_while_the_control_loop_ticks(tmp_path):
    import os
    import signal
    import time

    from tests.daemon_util import processes_mentioning

    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(30)
        env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"}  # pet every 0.2 s
        d = Daemon(tmp_path, env=env)
        while "READY=1" not in sock.recv(1024).decode():
            pass
        while "WATCHDOG=1" not in sock.recv(1024).decode():
            pass
        (control,) = [
            p
            for p in processes_mentioning(str(d.dir))
            if "robotd.control.process" in Path(f"/proc/{p}/cmdline").read_text()
        ]
        os.kill(control, signal.SIGSTOP)  # the loop stops ticking
        try:
            sock.settimeout(0.3)
            petted_after = []
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                try:
                    petted_after.append("WATCHDOG=1" in sock.recv(1024).decode())
                except TimeoutError:
                    continue
            # One pet may already be in flight from before the stop; none after that.
            assert sum(petted_after[1:]) == 0, petted_after
        finally:
            os.kill(control, signal.SIGCONT)
        sock.settimeout(10)
        while "WATCHDOG=1" not in sock.recv(1024).decode():
            pass
        d.signal()
        assert d.wait_exit() == 0
