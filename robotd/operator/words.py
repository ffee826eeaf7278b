"""The daemon's state in words, for people: the same phrases in robotctl, its live view
and the daemon's own status line. Every field may be missing or of the wrong type (it
comes off a wire); nothing here raises."""

from __future__ import annotations

import re
from typing import Any

# Exactly the causes the control lane latches a fault with (robotd/control: kernel.fault,
# the startup latch in episode.py, mainwatch.py when the main process is gone or silent).
CAUSES = {
    "estop": "e-stop",
    "driver": "joint driver fault",
    "safety": "safety shield: rejected actions",
    "startup": "started latched",
    "main_gone": "control lane lost its main process",
    "main_silent": "main process silent (stopped or hung)",
}

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def printable(text: Any) -> str:
    """`text` safe for a terminal: every control character (C0, DEL, C1) shown as a
    visible escape (``\\x1b``), so nothing off a wire can move the cursor or retitle it."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def _text(value: Any, limit: int = 120) -> str:
    flat = " ".join(str(value).split())
    return printable(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def _cause(cause: Any) -> str:
    return CAUSES.get(cause, _text(cause or "fault", 40)) if isinstance(cause, str) else "fault"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _also(fault: dict[str, Any]) -> str:
    """"; also: e-stop 'reason B' (+2 more)" for the causes latched after the first."""
    later = _count(fault.get("later"))
    if not later:
        return ""
    detail = fault.get("latest_detail")
    quoted = f" '{_text(detail, 80)}'" if detail else ""
    more = f" (+{later - 1} more)" if later > 1 else ""
    return f"; also: {_cause(fault.get('latest_cause'))}{quoted}{more}"


def fault_words(fault: Any) -> str:
    """'e-stop: pressed at the bench (clear_fault to leave)' and the like; '' for none. The
    cause is the first one latched (what stopped the robot); later ones follow, bounded."""
    if not isinstance(fault, dict):
        return "" if fault is None else _text(fault)
    cause = fault.get("cause")
    name = _cause(cause)
    detail = fault.get("detail")
    text = (f"{name}: {_text(detail)}" if detail else name) + _also(fault)
    if fault.get("active") is True:
        present = fault.get("present")
        other = isinstance(present, str) and present not in ("", cause)  # a later cause
        which = f"{_cause(present)} " if other else ""
        return f"{text} ({which}still present: cannot be cleared yet)"
    return f"{text} (clear_fault to leave)"


def is_estop(state: Any) -> bool:
    """The fault holds an e-stop, its first cause or a later one (the fault shown stays the
    first cause: a safety fault, then an operator's e-stop, is still an e-stopped robot)."""
    fault = state.get("fault") if isinstance(state, dict) else None
    return isinstance(fault, dict) and (fault.get("cause") == "estop" or fault.get("estop") is True)


def lane_words(state: Any) -> str:
    """'LANE SILENT 12.3 s (last: RUNNING episode 11 step 427)' when the daemon says the
    control lane has gone silent (its state is then only the lane's last word), else ''."""
    if not isinstance(state, dict) or state.get("lane_silent") is not True:
        return ""
    age = state.get("lane_age_s")
    secs = f"{age:.1f}" if isinstance(age, int | float) and not isinstance(age, bool) else "?"
    return f"LANE SILENT {secs} s (last: {state_words({**state, 'lane_silent': False})})"


def state_words(state: Any) -> str:
    """'FAULT — e-stop: …' or 'RUNNING episode 3 step 110' (or `lane_words` when silent)."""
    if not isinstance(state, dict):
        return "unknown"
    if silent := lane_words(state):
        return silent
    name = _text(state.get("state") or "?", 20)
    if name == "FAULT":
        cause = fault_words(state.get("fault"))
        return f"FAULT — {cause}" if cause else "FAULT"
    parts = [name]
    if isinstance(state.get("episode"), int) and state["episode"] > 0:
        parts.append(f"episode {state['episode']}")
    if isinstance(state.get("step"), int) and name == "RUNNING":
        parts.append(f"step {state['step']}")
    stale = state.get("stale_cameras")
    if name == "RUNNING" and isinstance(stale, list | tuple) and stale:
        names = ", ".join(_text(str(c), 40) for c in stale[:4])
        more = f" (+{len(stale) - 4} more)" if len(stale) > 4 else ""
        parts.append(f"— no fresh frame from camera {names}{more}: holding, no act asked")
    if state.get("outcome") and name in ("ENDED", "RESETTING"):
        parts.append(f"({_text(state['outcome'], 40)})")
    if name in ("ENDED", "RESETTING"):  # the one state that waits on the operator silently
        parts.append("— reset_done when the robot is back at the start")
    return " ".join(parts)


def torque_words(state: Any) -> str:
    """'on', 'off', or 'on — controlled stop (e-stop): off in 0.4 s' while a category-1
    e-stop holds the arm before torque goes off ('—' when the daemon did not say)."""
    if not isinstance(state, dict) or not isinstance(state.get("torque"), bool):
        return "—"
    if not state["torque"]:
        return "off"
    left = state.get("stopping_s")
    if isinstance(left, int | float) and not isinstance(left, bool) and 0 <= left < 1e6:
        return f"on — controlled stop (e-stop): off in {left:.1f} s"
    return "on"


def trace_words(trace: Any) -> str:
    """'recording' or 'NOT recording: disk full (episode-000001.mcap: …); 331 ticks of this
    episode lost', from status's `trace` (TraceStore.health); '' when it is no dict."""
    if not isinstance(trace, dict):
        return ""
    stopped = [_text(s, 60) for s in trace.get("stopped") or [] if isinstance(s, str)]
    if trace.get("recording") is True:
        out = "recording"
        if stopped:
            out += f" (write errors closed {', '.join(stopped)} earlier)"
    else:
        refused = trace.get("refused") if isinstance(trace.get("refused"), dict) else {}
        why = "disk full" if refused.get("disk_full") is True else "write error"
        where = f"{_text(refused['file'], 60)}: " if isinstance(refused.get("file"), str) else ""
        out = f"NOT recording: {why} ({where}{_text(refused.get('error', '?'))})"
        if lost := _count(trace.get("lost_ticks")):
            out += f"; {lost} ticks of this episode lost"
        out += "; the robot carries on"
    dropped = trace.get("dropped") if isinstance(trace.get("dropped"), dict) else {}
    records, frames = _count(dropped.get("records")), _count(dropped.get("frames"))
    if records or frames:
        out += f"; queue full: {records} records, {frames} frames dropped"
    return out
