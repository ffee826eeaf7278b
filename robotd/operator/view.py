"""The screen of `robotctl watch`, drawn from the newest telemetry message.

`render(screen)` is a pure function of what the watcher knows (the last message, when
it came, whether a daemon is there, the last e-stop outcome), so the same screens can
be checked without a terminal. Every telemetry field may be missing or mistyped:
what is not there shows as "—"; the worker link (`link`, a map of a few words) shows
whatever the daemon reports, or "not reported". Two kinds of STALE: the daemon's
telemetry stopped (`age_s`), or the daemon says its control lane went silent (the
message's `state.lane_silent`, with the lane's age when it was sent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from robotd.operator.words import fault_words, is_estop, printable, state_words, torque_words

STATE_STYLE = {
    "RUNNING": "bold green",
    "IDLE": "bold cyan",
    "ENDED": "bold yellow",
    "RESETTING": "bold yellow",
    "FAULT": "bold white on red",
}


@dataclass
class Screen:
    endpoint: str
    msg: dict[str, Any] | None = None  # the newest telemetry message
    age_s: float | None = None  # seconds since it came
    absent: str = ""  # why there is no daemon right now ("" when its socket is there)
    # a daemon holds the run directory but does not serve yet (start-up: its policy loading)
    # or any more (stopping), in words; "" otherwise
    starting: str = ""
    stale_after_s: float = 2.0
    notice: str = ""  # the last e-stop's outcome, in words
    notice_ok: bool = True


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _num(value: Any, fmt: str = "{:g}") -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return fmt.format(value)


def _state_line(state: Any) -> Text:
    name = _get(state, "state")
    name = name if isinstance(name, str) else "?"
    text = Text()
    if is_estop(state):
        text.append(" E-STOP ", style="bold white on red")
        text.append(" ")
    text.append(f" {printable(name[:20])} ", style=STATE_STYLE.get(name, "bold"))
    if name == "FAULT":
        text.append("  " + fault_words(_get(state, "fault")), style="bold red")
    return text


def _counters(msg: dict[str, Any]) -> Table:
    c = _get(msg, "counters") or {}
    state = _get(msg, "state") or {}
    lat = _get(msg, "lateness_us") or {}
    ask = _get(msg, "ask_latency", "ms") or {}
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="dim", no_wrap=True)
    t.add_column()
    t.add_row(
        "episode",
        f"{_num(_get(state, 'episode'))}  step {_num(_get(state, 'step'))}"
        f"  worker episode {printable(_get(state, 'wep') or '—')}"
        f" step {_num(_get(state, 'wstep'))}",
    )
    t.add_row(
        "rate",
        f"{_num(_get(msg, 'hz'), '{:.1f}')} Hz   lateness p50 "
        f"{_num(lat.get('p50'), '{:.0f}')} µs  p99 {_num(lat.get('p99'), '{:.0f}')} µs"
        f"   missed {_num(c.get('missed_ticks'))}",
    )
    flight = _get(state, "in_flight")
    t.add_row(
        "queue",
        f"{_num(_get(state, 'queue'))} rows" + ("   act in flight" if flight is True else ""),
    )
    t.add_row(
        "acts",
        f"{_num(c.get('acts'))}   chunks {_num(c.get('chunks'))}   ask → chunk "
        f"p50 {_num(ask.get('p50'), '{:.0f}')} ms  p99 {_num(ask.get('p99'), '{:.0f}')} ms",
    )
    t.add_row(
        "holds",
        f"{_num(c.get('holds'))}   longest run {_num(c.get('max_consecutive_holds'))}"
        f"   starved episodes {_num(c.get('starved_episodes'))}",
    )
    t.add_row("resets", f"{_num(c.get('episode_resets'))} worker-side episode resets")
    t.add_row(
        "shield",
        f"{_num(c.get('interventions'))} interventions: clipped "
        f"{_num(c.get('clipped'))}  clamped {_num(c.get('clamped'))}  rejected "
        f"{_num(c.get('rejected'))}",
    )
    t.add_row(
        "uploads",
        f"{_num(c.get('uploaded_frames'))} frames   inline "
        f"{_num(c.get('inline_frames'))}   skipped {_num(c.get('skipped_frames'))}   "
        f"refused {_num(c.get('refused_frames'))}",
    )
    link = _get(msg, "link")
    if isinstance(link, dict) and link:
        pairs = list(link.items())[:6]
        words = "   ".join(printable(f"{str(k)[:20]} {str(v)[:60]}") for k, v in pairs)
        t.add_row("link", words)
    else:
        t.add_row("link", Text("worker link state not reported by this daemon", style="dim"))
    t.add_row("torque", torque_words(state))
    return t


def _lane_stale(screen: Screen) -> Text | None:
    """The banner when the daemon says the control lane went silent, else None."""
    state = _get(screen.msg, "state")
    if _get(state, "lane_silent") is not True:
        return None
    age = _get(state, "lane_age_s")
    if isinstance(age, int | float) and not isinstance(age, bool):
        age += screen.age_s or 0.0  # it has gone on aging since the message was sent
        when = f"{age:.0f} s"
    else:
        when = "a while"
    last = state_words({**state, "lane_silent": False})
    return Text(
        f" STALE  control lane silent {when} (last: {last}): what follows is its last word ",
        style="bold black on yellow",
    )


WARN = "bold black on yellow"
ALARM = "bold white on red"


def headlines(screen: Screen) -> list[tuple[str, str, str]]:
    """What the screen must say before its counters, each as (word, detail, style): a
    daemon starting or not serving, none at all, or an update too old to be live."""
    if screen.msg is None and screen.starting:
        return [("STARTING", screen.starting, WARN)]
    if screen.msg is None:
        return [("NO DAEMON", f"{screen.absent or 'nothing heard yet'}; waiting for one", ALARM)]
    heads = []
    if screen.starting:
        heads.append(("NOT SERVING", screen.starting, WARN))
    if screen.absent:
        heads.append(("NO DAEMON", screen.absent, ALARM))
    if screen.age_s is not None and screen.age_s > screen.stale_after_s:
        heads.append(("STALE", f"last update {screen.age_s:.0f} s ago: what follows is old", WARN))
    return heads


def render(screen: Screen) -> Group:
    """The whole screen: a headline (state, or no daemon, or stale), the counters, keys."""
    parts: list[Any] = [Text(f"robotd  {screen.endpoint}", style="bold")]
    parts += [Text(f" {word}  {detail}", style=style) for word, detail, style in headlines(screen)]
    if screen.msg is not None:
        if (lane := _lane_stale(screen)) is not None:
            parts.append(lane)
        parts.append(_state_line(_get(screen.msg, "state")))
        parts.append(_counters(screen.msg))
    if screen.notice:
        style = "bold green" if screen.notice_ok else ALARM
        parts.append(Text(screen.notice, style=style))
    parts.append(Text("[e] E-STOP    [q] quit", style="bold"))
    return Group(*parts)


def line(screen: Screen, stamp: str = "") -> str:
    """The screen as one plain line, for a watcher without a terminal: the headline (no
    daemon, stale, the state in words) and the main counters."""
    heads = [f"{word} {detail}" for word, detail, _ in headlines(screen)]
    head = " ".join(([stamp] if stamp else []) + (["; ".join(heads)] if heads else []))
    if screen.msg is None:
        return printable(head)
    head += "; " if heads else (" " if stamp else "")
    state = _get(screen.msg, "state")
    fault = _get(state, "fault")
    if is_estop(state) and _get(fault, "cause") != "estop":
        head += "E-STOP "
    c = _get(screen.msg, "counters") or {}
    p99 = _get(screen.msg, "lateness_us", "p99")
    return printable(
        f"{head}{state_words(state)} | {_num(_get(screen.msg, 'hz'), '{:.1f}')} Hz "
        f"p99 {_num(p99, '{:.0f}')} µs missed {_num(_get(c, 'missed_ticks'))} "
        f"| queue {_num(_get(state, 'queue'))} acts {_num(_get(c, 'acts'))} "
        f"holds {_num(_get(c, 'holds'))} shield {_num(_get(c, 'interventions'))}"
    )
