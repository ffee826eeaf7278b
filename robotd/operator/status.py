"""The live status line of `robotd run` on a terminal: state (a fault with its cause, or
LANE SILENT with the control lane's last state), step, Hz, lateness p99, queue, acts,
holds, shield interventions.

Log records never run into it: while it is shown, the log handlers that write to the
terminal are swapped for one that clears the line, writes the record and redraws the
line below it. When stderr or stdout is not a terminal there is no status line at
all, only the logs.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import anyio

from robotd.operator.words import fault_words, lane_words
from robotd.runtime.view import DaemonView

CLEAR = "\r\x1b[2K"


def link_words(link: dict[str, Any] | None) -> str:
    """The policy link in a few words when it is not up ("" when it is)."""
    if not link or link.get("state") in (None, "up"):
        return ""
    if link.get("state") == "gone":
        return f" | worker gone, reconnecting ({link.get('for_s', 0):.0f} s)"
    return " | connecting to the worker"


def format_status(
    stats: dict[str, Any],
    state: dict[str, Any],
    hz: float,
    p99_us: float,
    link: dict[str, Any] | None = None,
) -> str:
    name = state.get("state", "?")
    if silent := lane_words(state):  # the numbers that follow are the lane's last ones
        head = silent
    elif name == "FAULT":
        head = f"FAULT {fault_words(state.get('fault')) or '(cause unknown)'}"
    else:
        head = f"{name:<9} ep {state.get('episode', 0)} step {state.get('step', 0):>6}"
    return (
        f"{head} | {hz:6.1f} Hz p99 {p99_us:7.0f} µs missed {stats.get('missed_ticks', 0)} "
        f"| queue {state.get('queue', 0):>3} acts {stats.get('acts', 0)} "
        f"holds {stats.get('holds', 0)} shield {stats.get('interventions', 0)}"
        f"{link_words(link)}"
    )


class LineKeepingHandler(logging.StreamHandler):
    """Writes each record above the status line: clear the line, the record, the line."""

    def __init__(self, stream: TextIO, like: logging.Handler | None = None) -> None:
        super().__init__(stream)
        self.line = ""
        if like is not None:
            self.setLevel(like.level)
            self.setFormatter(like.formatter)
            for f in like.filters:
                self.addFilter(f)

    def _write(self, text: str) -> None:
        self.acquire()  # records come from any thread; the redraw from the event loop
        try:
            self.stream.write(text)
            self.stream.flush()
        finally:
            self.release()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._write(f"{CLEAR}{self.format(record)}\n{self.line}")
        except Exception:
            self.handleError(record)

    def draw(self, line: str) -> None:
        self.line = line
        self._write(CLEAR + line)

    def finish(self) -> None:
        if self.line:
            self._write(CLEAR)
        self.line = ""


def _is_terminal() -> bool:
    return all(s is not None and s.isatty() for s in (sys.stdout, sys.stderr))


class StatusLine:
    """Redraws one line on a terminal four times a second; does nothing otherwise."""

    def __init__(self, view: DaemonView, stream: TextIO | None = None) -> None:
        self.view = view
        self.stream = stream or sys.stderr
        self.tty = _is_terminal() if stream is None else stream.isatty()

    def line(self) -> str:
        s = self.view.summary
        return format_status(
            s.totals, self.view.state(), s.measured_hz(), s.lateness()["p99"], self.view.link()
        )

    def _install(self) -> tuple[LineKeepingHandler, list[logging.Handler]]:
        """Swap the root logger's handlers on our stream for one that keeps the line."""
        root = logging.getLogger()
        ours = [
            h
            for h in root.handlers
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is self.stream
        ]
        keeper = LineKeepingHandler(self.stream, ours[0] if ours else None)
        if keeper.formatter is None:
            keeper.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
        for h in ours:
            root.removeHandler(h)
        root.addHandler(keeper)
        return keeper, ours

    async def run(self) -> None:
        if not self.tty:
            return
        keeper, replaced = self._install()
        root = logging.getLogger()
        try:
            while True:
                keeper.draw(self.line())
                await anyio.sleep(0.25)
        finally:
            keeper.finish()
            root.removeHandler(keeper)
            for h in replaced:
                root.addHandler(h)
