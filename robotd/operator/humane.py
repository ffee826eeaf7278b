"""robotctl's output for people: replies as short aligned lines, not raw JSON, and
KEY=VALUE arguments read the way the config reads them (TOML values)."""

from __future__ import annotations

from typing import Any

from robotd.operator.words import state_words

MAX_LINES = 400


def assignments(items: list[str]) -> dict[str, Any]:
    """["control.hz=50", ...] → {"control.hz": 50}; ValueError naming a malformed one."""
    from robotd.config import _parse_value

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"params set: {item!r}: expected KEY=VALUE (e.g. control.hz=50)")
        out[key.strip()] = _parse_value(value.strip())
    if not out:
        raise ValueError("params set: give at least one KEY=VALUE")
    return out


def _flat(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        rows: list[tuple[str, Any]] = []
        for k, v in value.items():
            rows += _flat(v, f"{prefix}.{k}" if prefix else str(k))
        return rows
    return [(prefix, value)]


def _lines(result: Any) -> str:
    rows = _flat(result)
    if not rows or rows == [("", result)]:
        return "" if result is None else str(result)
    width = min(max(len(k) for k, _ in rows), 40)
    text = [f"{k:<{width}}  {_value(v)}" for k, v in rows[:MAX_LINES]]
    if len(rows) > MAX_LINES:
        text.append(f"… {len(rows) - MAX_LINES} more (--json for all)")
    return "\n".join(text)


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list) and len(v) > 8:
        return f"[{', '.join(map(str, v[:8]))}, … {len(v)} items]"
    return str(v)


def status(result: dict[str, Any]) -> str:
    lines = [f"state    {state_words(result)}"]
    if isinstance(result.get("queue"), int):
        flight = "  act in flight" if result.get("in_flight") is True else ""
        lines.append(f"queue    {result['queue']} rows{flight}")
    if "torque" in result:
        lines.append(f"torque   {'on' if result['torque'] is True else 'off'}")
    if result.get("via") == "lane.sock":
        lines.append("via      lane.sock: the main process did not answer, the control lane did")
    if isinstance(result.get("link"), dict) and result["link"]:
        lines.append("link     " + "  ".join(f"{k} {v}" for k, v in result["link"].items()))
    if result.get("run_id"):
        lines.append(f"run      {result['run_id']} on robot {result.get('robot', '?')!r}")
    return "\n".join(lines)


def result(command: str, value: Any) -> str:
    """One command's result for a person."""
    if isinstance(value, str):
        return value
    if command in ("status", "start", "stop", "estop", "clear_fault", "reset_done") and isinstance(
        value, dict
    ):
        return status(value)
    if command == "verdict" and isinstance(value, dict):
        said = "success" if value.get("success") else "failure"
        notes = f": {value['notes']}" if value.get("notes") else ""
        return f"episode {value.get('episode')}: {said}{notes}"
    if command == "keygen" and isinstance(value, dict):
        return (
            f"public key  {value.get('public')}   (copy it into the daemon's "
            f"runtime.curve_clients directory)\nsecret key  {value.get('secret')}   "
            "(keep it here; robotctl --key uses it)"
        )
    return _lines(value)
