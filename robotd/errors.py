"""The one error formatter: messages that name what was wrong and where.

Config files, driver options, contracts and start-up specs are all validated by pydantic;
every ValidationError becomes lines of ``<where>: <key.path>: <rule>`` here, and any other
exception one line of ``Type: text`` (`one_line`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError


class ConfigError(ValueError):
    """A config file, override or driver option is invalid; the message names file, key and rule."""


Loc = tuple[Any, ...]


def dotted(loc: Loc) -> str:
    """("cameras", "top", "fps") -> "cameras.top.fps"; ("lower", 1) -> "lower[1]"."""
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


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rule(err: dict[str, Any]) -> str:
    """The rule one pydantic error broke, in words (with the value given, shortened)."""
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
        return f"must be {sym} {_num(ctx.get(key))}, got {_short(got)}"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {_short(got)}"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} entries, got {len(got) if got else 0}"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} entries"
    if kind == "string_too_short":
        n = ctx.get("min_length")
        if n == 1:
            return "must not be empty"
        return f"must be at least {n} characters, got {_short(got)}"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters, got {_short(got)}"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')!r}, got {_short(got)}"
    if kind == "finite_number":
        return f"must be a finite number, got {_short(got)}"
    if kind == "value_error":
        return str(ctx.get("error", err.get("msg", "")))
    return f"{err.get('msg', 'invalid')}, got {_short(got)}"


def validation_lines(
    exc: ValidationError,
    *,
    prefix: str = "",
    where: str = "",
    overridden: frozenset[str] = frozenset(),
    path: Callable[[Loc], str] = dotted,
    describe: Callable[[dict[str, Any]], list[tuple[Loc, str]] | None] | None = None,
) -> list[str]:
    """One line per problem: ``<where>: <prefix.key.path>: <rule>``.

    A key given by --set (in `overridden`) is named as such: ``--set control.hz: ...``.
    `path` spells a location (contracts quote their stream keys); `describe` may expand
    one error into (sub-location, rule) pairs of its own (a validator that found several).
    """
    lines = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        pairs = describe(err) if describe is not None else None
        for sub, text in pairs if pairs is not None else [((), rule(err))]:
            at = path(loc + sub)
            if prefix:
                at = f"{prefix}.{at}" if at else prefix
            if at and any(at == k or at.startswith(k + ".") for k in overridden):
                lines.append(f"--set {at}: {text}")
                continue
            head = ": ".join(p for p in (where, at) if p)
            lines.append(f"{head}: {text}" if head else text)
    return lines


def format_validation_error(
    exc: ValidationError, where: str, prefix: str = "", overridden: frozenset[str] = frozenset()
) -> str:
    """validation_lines joined by newlines (a config file's errors, all at once)."""
    return "\n".join(validation_lines(exc, prefix=prefix, where=where, overridden=overridden))


def one_line(exc: BaseException) -> str:
    """An exception as one line: pydantic errors as 'loc: rule; …', others as 'Type: text'."""
    if isinstance(exc, ValidationError):
        with contextlib.suppress(Exception):
            return "; ".join(validation_lines(exc)) or str(exc)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
