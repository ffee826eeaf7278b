"""The daemon's state in words, for people: the same phrases in robotctl, its live view
and the daemon's own status line. Every field may be missing or of the wrong type (it
comes off a wire); nothing here raises."""

from __future__ import annotations

from typing import Any

CAUSES = {
    "estop": "e-stop",
    "driver": "joint driver fault",
    "safety": "safety shield: rejected actions",
    "camera": "camera fault",
    "startup": "started latched",
    "lane": "control lane lost its main process",
}


def _text(value: Any, limit: int = 120) -> str:
    flat = " ".join(str(value).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def fault_words(fault: Any) -> str:
    """'e-stop: pressed at the bench (cleared by clear_fault)' and the like; '' for none."""
    if not isinstance(fault, dict):
        return "" if fault is None else _text(fault)
    cause = fault.get("cause")
    name = CAUSES.get(cause, _text(cause or "fault", 40)) if isinstance(cause, str) else "fault"
    detail = fault.get("detail")
    text = f"{name}: {_text(detail)}" if detail else name
    if fault.get("active") is True:
        return f"{text} (still present: cannot be cleared yet)"
    return f"{text} (clear_fault to leave)"


def is_estop(state: Any) -> bool:
    fault = state.get("fault") if isinstance(state, dict) else None
    return isinstance(fault, dict) and fault.get("cause") == "estop"


def state_words(state: Any) -> str:
    """'FAULT — e-stop: …' or 'RUNNING episode 3 step 110'."""
    if not isinstance(state, dict):
        return "unknown"
    name = _text(state.get("state") or "?", 20)
    if name == "FAULT":
        cause = fault_words(state.get("fault"))
        return f"FAULT — {cause}" if cause else "FAULT"
    parts = [name]
    if isinstance(state.get("episode"), int) and state["episode"] > 0:
        parts.append(f"episode {state['episode']}")
    if isinstance(state.get("step"), int) and name == "RUNNING":
        parts.append(f"step {state['step']}")
    if state.get("outcome") and name in ("ENDED", "RESETTING"):
        parts.append(f"({_text(state['outcome'], 40)})")
    return " ".join(parts)
