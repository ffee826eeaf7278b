"""Errors that carry a human message naming what was wrong and where."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class ConfigError(ValueError):
    """A config file, override or driver option is invalid; the message names file, key and rule."""


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _num(value: Any) -> Any:
    """0.0 reads as 0 in a message: the rule, not the float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _rule(err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    got = err.get("input")
    ops = {
        "greater_than": (">", "gt"),
        "greater_than_equal": (">=", "ge"),
        "less_than": ("<", "lt"),
        "less_than_equal": ("<=", "le"),
    }
    if kind in ops:
        sym, key = ops[kind]
        return f"must be {sym} {_num(ctx.get(key))}, got {got!r}"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {got!r}"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} entries, got {len(got) if got else 0}"
    if kind == "value_error":
        return str(ctx.get("error", err.get("msg", "")))
    return f"{err.get('msg', 'invalid')}, got {got!r}"


def format_validation_error(
    exc: ValidationError, where: str, prefix: str = "", overridden: frozenset[str] = frozenset()
) -> str:
    """One line per problem: ``<where>: <key.path>: <rule>``; a key given by --set is named
    as such (``--set control.hz: must be > 0, got -5``)."""
    lines = []
    for err in exc.errors():
        path = _loc(tuple(err.get("loc", ())))
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        rule = _rule(err)
        if path and any(path == k or path.startswith(k + ".") for k in overridden):
            lines.append(f"--set {path}: {rule}")
            continue
        # A model-level validator names its own key ("lower: ..."); keep it under the prefix.
        lines.append(f"{where}: {path}: {rule}" if path else f"{where}: {rule}")
    return "\n".join(lines)
