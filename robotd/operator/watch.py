"""`robotctl watch`: the live view, redrawn four times a second from the telemetry socket.

It says "no daemon" when there is none, "stale" when updates stopped, and the key
`e` sends an e-stop (the outcome is shown, success only when the daemon confirmed it).
The terminal is put in cbreak mode for the keys and always restored.
"""

from __future__ import annotations

import contextlib
import os
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator

import zmq
from rich.console import Console
from rich.live import Live

from robotd import wire
from robotd.operator.client import ipc_path
from robotd.operator.curve import set_curve_client
from robotd.operator.locate import Target
from robotd.operator.view import Screen, render

REDRAW_S = 0.25
MAX_TELEMETRY_BYTES = 1 << 20


@contextlib.contextmanager
def _keys() -> Iterator[int | None]:
    """stdin in cbreak mode (keys one at a time, Ctrl-C still a signal) when a terminal."""
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0 or not os.isatty(fd):
        yield None
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _subscribe(target: Target) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_TELEMETRY_BYTES)
    sock.setsockopt(zmq.RCVHWM, 10)
    if target.curve is not None and target.telemetry.startswith("tcp://"):
        c = target.curve
        set_curve_client(sock, c.server_public, c.public, c.secret)
    sock.setsockopt(zmq.SUBSCRIBE, b"status")
    sock.connect(target.telemetry)
    return sock


def _absent(target: Target) -> str:
    path = ipc_path(target.telemetry)
    if path is None:
        return ""
    try:
        os.stat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    return ""


def _newest(sock: zmq.Socket) -> dict | None:
    msg = None
    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return msg
        if len(frames) != 2:
            continue
        with contextlib.suppress(wire.WireError):
            got = wire.unpackb(frames[1])
            if isinstance(got, dict):
                msg = got


def watch(
    target: Target,
    estop: Callable[[], tuple[bool, str]],
    *,
    seconds: float | None = None,
    console: Console | None = None,
) -> int:
    """Run the view until `q`, Ctrl-C or `seconds`; 0."""
    console = console or Console()
    sock = _subscribe(target)
    screen = Screen(endpoint=target.telemetry)
    received_at: float | None = None
    end = None if seconds is None else time.monotonic() + seconds
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    try:
        with _keys() as keys, Live(render(screen), console=console, auto_refresh=False) as live:
            if keys is not None:
                poller.register(keys, zmq.POLLIN)
            while end is None or time.monotonic() < end:
                ready = dict(poller.poll(int(REDRAW_S * 1000)))
                if sock in ready:
                    msg = _newest(sock)
                    if msg is not None:
                        screen.msg, received_at = msg, time.monotonic()
                if keys is not None and keys in ready:
                    pressed = os.read(keys, 32).decode(errors="replace")
                    if "q" in pressed.lower():
                        break
                    if "e" in pressed.lower():
                        screen.notice, screen.notice_ok = "E-STOP: sending…", True
                        live.update(render(screen), refresh=True)
                        ok, words = estop()
                        stamp = time.strftime("%H:%M:%S")
                        screen.notice = f"{stamp} E-STOP {'sent' if ok else 'FAILED'}: {words}"
                        screen.notice_ok = ok
                screen.absent = _absent(target)
                screen.age_s = None if received_at is None else time.monotonic() - received_at
                live.update(render(screen), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close(linger=0)
    return 0
