"""The contract's rules and their errors: bounds, and a ContractError naming the key path
and the rule broken (pydantic's errors converted)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from robotd.errors import validation_lines

MAX_STREAMS = 64
MAX_WINDOW = 256
MAX_IMAGE_SIDE = 16384
# A frame's area: 8192 x 4096, above 8K UHD's 33,177,600 (100 MB a frame raw). Each side
# alone could ask for 16384 x 16384, 805 MB a frame, fitted and sent every step.
MAX_IMAGE_PIXELS = 1 << 25
MAX_STEPS = 10_000_000  # |offset| or every, in steps, after resolving
MAX_RTC_ROWS = 4096  # an act's rtc: its delay, and the rows of its prefix and rest, each
MAX_RTC_DIM = 1024  # an act's rtc: values per row
_MAX_SHOWN = 5

Loc = tuple[str | int, ...]


class ContractError(ValueError):
    """A contract broke a rule. `problems` holds one line per rule broken."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        shown = "; ".join(self.problems[:_MAX_SHOWN])
        more = len(self.problems) - _MAX_SHOWN
        super().__init__(shown + (f" (+{more} more)" if more > 0 else ""))


class _Rules(ValueError):
    """Raised inside validators; carries (loc below the validated model, rule) pairs."""

    def __init__(self, problems: list[tuple[Loc, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(msg for _, msg in problems))


def _num(x: float) -> str:
    """-15.0 -> '-15', -1.5 -> '-1.5': contracts read better without trailing .0."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def _path(where: str, loc: Loc, keyed_root: bool) -> str:
    """("streams", "top", "at", 1) -> "observations.streams['top'].at[1]"."""
    out = where
    for i, part in enumerate(loc):
        if part == "[key]":
            out += " (the key itself)"
        elif isinstance(part, int):
            out += f"[{part}]"
        elif keyed_root and i == 1 and loc[0] == "streams":
            out += f"[{part!r}]"
        else:
            out += f".{part}"
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _convert(err: ValidationError, where: str, keyed_root: bool) -> ContractError:
    """Turn pydantic's ValidationError into a ContractError naming each key path (through the
    one formatter, robotd.errors: contracts spell paths their own way and expand a
    validator's several problems)."""

    def describe(e: dict[str, Any]) -> list[tuple[Loc, str]] | None:
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, _Rules):
            return list(cause.problems)
        if e.get("type") == "extra_forbidden":
            return [((), "unknown field (extra fields not allowed)")]
        if e.get("type") == "value_error" and cause is not None:
            return None  # the rule as the validator said it
        return [((), f"{e.get('msg', 'invalid')} (got {_short(e.get('input'))})")]

    lines = validation_lines(
        err, path=lambda loc: _path(where, loc, keyed_root), describe=describe
    )
    return ContractError(lines)


def _window_problems(at: list[float]) -> list[str]:
    if not at:
        return ["empty window (give at least one offset, e.g. [0])"]
    out: list[str] = []
    if len(at) > MAX_WINDOW:
        out.append(f"window of {len(at)} entries (at most {MAX_WINDOW})")
    out += [f"offset {_num(o)} > 0 (offsets must be <= 0)" for o in at if o > 0]
    seen: set[float] = set()
    for o in at:
        if o in seen:
            out.append(f"duplicate offset {_num(o)} (each offset once)")
        seen.add(o)
    return out


def _whole_steps(key: str, field: str, values: list[float]) -> list[tuple[Loc, str]]:
    label = "offset" if field == "at" else "every"
    return [
        (
            ("streams", key, field),
            f"{label} {_num(v)} is not a whole number of steps "
            "(unit is steps: values must be whole numbers)",
        )
        for v in values
        if not float(v).is_integer()
    ]


