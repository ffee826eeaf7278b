"""`robotctl watch`: the live view, redrawn four times a second from the telemetry socket.

It says "no daemon" when there is none, "stale" when updates stopped, and the key
`e` sends an e-stop (the outcome is shown, success only when the daemon confirmed it).
The terminal is put in cbreak mode for the keys and always restored. When stdout is not
a terminal (a file, a pipe), or with --json, it prints a line per update instead, each
flushed as it is written: the state and counters in words, or (--json) JSON lines.
"""

from __future__ import annotations

import contextlib
import json
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
from robotd.operator.client import ipc_path, starting
from robotd.operator.curve import set_curve_client
from robotd.operator.locate import Target
from robotd.operator.view import Screen, line, render
from robotd.operator.words import printable

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


def _absent(target: Target) -> tuple[str, str]:
    """(why there is no daemon, what a daemon that is there but not serving is doing)."""
    path = ipc_path(target.telemetry)
    if path is None:
        return "", ""
    try:
        os.stat(path)
    except FileNotFoundError:
        words = starting(path)
        return ("", words) if words else (f"{path} does not exist", "")
    except OSError as exc:
        return f"{path}: {exc.strerror}", ""
    return "", ""


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


class _LiveSink:
    """The screen on a terminal, redrawn in place (rich Live)."""

    def __init__(self, console: Console, screen: Screen) -> None:
        self.live = Live(render(screen), console=console, auto_refresh=False)

    def __enter__(self) -> _LiveSink:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)

    def show(self, screen: Screen, fresh: bool) -> None:
        self.live.update(render(screen), refresh=True)

    def notice(self, screen: Screen) -> None:
        self.show(screen, False)


class _LineSink:
    """Without a terminal (or with --json): a line per update, flushed at once, so a file or
    a pipe follows as it happens. A line when a telemetry message came, and when the
    headline changes without one (no daemon, stale); with `as_json` each line is one JSON
    object: `{"ok": true, "telemetry": MESSAGE}`, or `{"ok": false, "error":
    {code, message}}` (code `unreachable`, `starting`: a daemon is there, not serving yet,
    or `stale`), or `{"ok": B, "notice": TEXT}`."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json
        self.said = ""  # the headline last said without a message

    def __enter__(self) -> _LineSink:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _print(self, text: str) -> None:
        print(text, flush=True)

    def show(self, screen: Screen, fresh: bool) -> None:
        stale = screen.age_s is not None and screen.age_s > screen.stale_after_s
        quiet = "none" if screen.msg is None else "stale" if stale else ""
        why = screen.absent or screen.starting
        headline = f"{quiet} {why}" if quiet or why else ""
        if not fresh and (not headline or headline == self.said):
            return
        self.said = headline
        if not self.json:
            self._print(line(screen, time.strftime("%H:%M:%S")))
        elif fresh:
            self._print(json.dumps({"ok": True, "telemetry": screen.msg}, default=str))
        else:
            code = "stale" if quiet == "stale" else "starting" if screen.starting else "unreachable"
            message = line(screen)
            self._print(json.dumps({"ok": False, "error": {"code": code, "message": message}}))

    def notice(self, screen: Screen) -> None:
        if self.json:
            self._print(json.dumps({"ok": screen.notice_ok, "notice": screen.notice}))
        else:
            self._print(printable(screen.notice))


def watch(
    target: Target,
    estop: Callable[[], tuple[bool, str]],
    *,
    seconds: float | None = None,
    console: Console | None = None,
    as_json: bool = False,
) -> int:
    """Run the view until `q`, Ctrl-C or `seconds`; 0. On a terminal (and not `as_json`) the
    screen, redrawn in place; otherwise a line per update (_LineSink)."""
    console = console or Console()
    lines = as_json or not console.is_terminal
    sock = _subscribe(target)
    screen = Screen(endpoint=target.telemetry)
    try:
        with _keys() as keys, _LineSink(as_json) if lines else _LiveSink(console, screen) as out:
            _loop(target, estop, sock, keys, screen, out, seconds)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close(linger=0)
    return 0


def _loop(
    target: Target,
    estop: Callable[[], tuple[bool, str]],
    sock: zmq.Socket,
    keys: int | None,
    screen: Screen,
    out: _LiveSink | _LineSink,
    seconds: float | None,
) -> None:
    received_at: float | None = None
    end = None if seconds is None else time.monotonic() + seconds
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if keys is not None:
        poller.register(keys, zmq.POLLIN)
    while end is None or time.monotonic() < end:
        ready = dict(poller.poll(int(REDRAW_S * 1000)))
        fresh = False
        if sock in ready:
            msg = _newest(sock)
            if msg is not None:
                screen.msg, received_at, fresh = msg, time.monotonic(), True
        if keys is not None and keys in ready:
            pressed = os.read(keys, 32).decode(errors="replace").lower()
            if "q" in pressed:
                break
            if "e" in pressed:
                _estop_key(estop, screen, out)
        screen.absent, screen.starting = _absent(target)
        screen.age_s = None if received_at is None else time.monotonic() - received_at
        out.show(screen, fresh)


def _estop_key(
    estop: Callable[[], tuple[bool, str]], screen: Screen, out: _LiveSink | _LineSink
) -> None:
    """The `e` key: the e-stop sent, its outcome shown (success only when confirmed)."""
    screen.notice, screen.notice_ok = "E-STOP: sending…", True
    out.notice(screen)
    ok, words = estop()
    stamp = time.strftime("%H:%M:%S")
    screen.notice = f"{stamp} E-STOP {'sent' if ok else 'FAILED'}: {words}"
    screen.notice_ok = ok
    out.notice(screen)
