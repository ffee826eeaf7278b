"""The live status line of `robotd run`: state, step, Hz, lateness p99, queue, acts, holds."""

from __future__ import annotations

import sys
from typing import Any

import anyio

from robotd.runtime.view import DaemonView


def format_status(stats: dict[str, Any], state: dict[str, Any], hz: float, p99_us: float) -> str:
    return (
        f"{state.get('state', '?'):<9} ep {state.get('episode', 0)} step {state.get('step', 0):>6} "
        f"| {hz:6.1f} Hz p99 {p99_us:7.0f} µs missed {stats.get('missed_ticks', 0)} "
        f"| queue {state.get('queue', 0):>3} acts {stats.get('acts', 0)} "
        f"holds {stats.get('holds', 0)} shield {stats.get('interventions', 0)}"
    )


class StatusLine:
    """Redraws one line on a terminal; prints a line every 10 s when not a terminal."""

    def __init__(self, view: DaemonView) -> None:
        self.view = view
        self.tty = sys.stderr.isatty()

    def line(self) -> str:
        s = self.view.summary
        return format_status(s.totals, self.view.state(), s.measured_hz(), s.lateness()["p99"])

    async def run(self) -> None:
        try:
            while True:
                await anyio.sleep(0.25 if self.tty else 10.0)
                if self.tty:
                    sys.stderr.write("\r\x1b[2K" + self.line())
                else:
                    sys.stderr.write(self.line() + "\n")
                sys.stderr.flush()
        finally:
            if self.tty:
                sys.stderr.write("\n")
