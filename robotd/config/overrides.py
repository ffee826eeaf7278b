"""`--set KEY=VALUE` overrides and who is to blame for a bad value: an error at a key a
--set gave (or inside a table a --set made) names the --set, not the file.

Also the one check every number of the config passes: finite (no NaN, no infinity),
reported as such (not as "must be <= 2000") together with the config's other errors.
"""

from __future__ import annotations

import datetime
import math
import re
import tomllib
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

from pydantic_core import ErrorDetails

from robotd.config.problems import LEADING_KEY, Problems
from robotd.errors import ConfigError, dotted, rule

# Where a --set put something: the key it set, and each table it had to make on the way,
# mapped to the --set key (the source named in errors).
Origins = dict[str, str]

# Tables whose values are not robotd's: the policy's constructor arguments (the policy's own
# business, infinity included).
FREE_FORM = ("policy.args",)


# Tables and arrays nested deeper than this are no robot's config (the deepest robotd reads,
# an openpi input's image, is 5 levels; a policy's args get the rest): past it, validating
# (and the TOML parser itself) would exhaust Python's stack.
MAX_DEPTH = 64
TOO_DEEP = f"tables and arrays nested more than {MAX_DEPTH} deep"


def parse_value(text: str) -> Any:
    """A --set value in TOML syntax; a bare word that is not TOML is taken as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise ConfigError(TOO_DEEP) from None


def too_deep(raw: dict[str, Any]) -> str | None:
    """The dotted key of the first value nested past MAX_DEPTH tables and arrays, else None
    (walked without recursion: it guards what recurses)."""
    stack: list[tuple[Any, str, int]] = [(raw, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return path if len(path) <= 80 else path[:77] + "..."
        if isinstance(node, dict):
            stack += [(v, f"{path}.{k}" if path else str(k), depth + 1) for k, v in node.items()]
        elif isinstance(node, list):
            stack += [(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(node)]
    return None


def apply_override(raw: dict[str, Any], assignment: str, origins: Origins) -> str:
    """Set one dotted key from KEY=VALUE and record it (and each table it made) in
    `origins`; returns the key."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE (e.g. control.hz=100)")
    key, _, text = assignment.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {assignment!r}: empty part in key path {key!r}")
    if any("[" in part for part in parts):
        raise ConfigError(
            f"--set {key.strip()}: an array's entry cannot be set by its index; set the whole "
            "array (e.g. joints.lower=[-1.0, -2.0])"
        )
    full = ".".join(parts)
    node = raw
    for i, part in enumerate(parts[:-1]):
        if part not in node:
            origins.setdefault(".".join(parts[: i + 1]), full)
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"--set {key}: {where} is a value, not a table")
        node = child
    try:
        node[parts[-1]] = parse_value(text.strip())
    except ConfigError as exc:
        raise ConfigError(f"--set {full}: {exc}") from None
    origins[full] = full
    return full


def _within(key: str, path: str) -> bool:
    return key == path or key.startswith((path + ".", path + "["))


def set_source(key: str, origins: Origins) -> tuple[str, str] | None:
    """(the table or key a --set gave that holds `key`, that --set's key), or None when
    `key` is the file's."""
    for path, source in sorted(origins.items(), key=lambda item: -len(item[0])):
        if key and _within(key, path):
            return path, source
    return None


def blame(where: str, key: str, origins: Origins) -> str:
    """How an error names a key: ``--set KEY`` when a --set gave it, ``--set SRC: KEY``
    when it lies in a table a --set made, else ``FILE: KEY``."""
    found = set_source(key, origins)
    if found is not None:
        path, source = found
        return f"--set {key}" if path == source else f"--set {source}: {key}"
    return f"{where}: {key}" if key else where


def blame_keys(where: str, keys: Sequence[str], origins: Origins) -> str:
    """How an error about several keys names them: by the first (`blame`), unless a --set
    gave another of them and not the first: ``--set SRC: FIRST``."""
    if set_source(keys[0], origins) is None:
        for key in keys[1:]:
            found = set_source(key, origins)
            if found is not None:
                return f"--set {found[1]}: {keys[0]}"
    return blame(where, keys[0], origins)



# A value of the wrong kind (the loader validates strictly: nothing is converted), in words
_KIND = {
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "list_type": "must be an array",
    "dict_type": "must be a table",
    "model_type": "must be a table",  # a section's model ("a valid dictionary or instance of")
}


def shown(value: Any) -> str:
    """A value of the wrong kind as a message shows it: a TOML date or time as written, a
    table or an array by its kind (not its whole contents), anything else by repr."""
    if isinstance(value, (datetime.date, datetime.time)):  # a datetime is a date
        return f"{value.isoformat()} (a TOML date or time)"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        tables = bool(value) and all(isinstance(v, dict) for v in value)
        return "an array of tables" if tables else "an array"
    return f"{value!r:.60}"


def _join(at: str, key: str) -> str:
    return f"{at}.{key}" if at and key else at or key


def _problems(err: ErrorDetails, at: str) -> list[tuple[tuple[str, ...], str]]:
    """One pydantic error as (keys, rule) pairs, the keys full dotted paths: a validator's
    Problems each; a rule about a table (or the whole config) whose text leads with a key of
    it, at that key; anything else at its own location."""
    raised = (err.get("ctx") or {}).get("error")
    found = raised.problems if isinstance(raised, Problems) else None
    if found is None:
        kind = err.get("type", "")
        text = rule(err)
        if kind == "finite_number":
            text = f"must be a finite number, got {err.get('input')!r:.60}"
        elif kind in _KIND:
            text = f"{_KIND[kind]}, got {shown(err.get('input'))}"
        whole = not at or isinstance(err.get("input"), dict)
        found = [((), text) if kind == "value_error" and whole else (("",), text)]
    out = []
    for keys, text in found:
        lead = LEADING_KEY.match(text) if not keys else None
        if lead is not None:
            keys, text = (lead.group(1),), text[lead.end() :]
        out.append((tuple(_join(at, k) for k in keys or ("",)), text))
    return out


def _plain(key: str) -> str:
    """A key as the file spells it: a contract's streams['top'] is streams.top."""
    return re.sub(r"\['([^']*)'\]", r".\1", key)


def error_lines(
    errors: Iterable[ErrorDetails],
    where: str,
    origins: Origins,
    prefix: str = "",
    skip: Collection[str] = (),
) -> list[str]:
    """A ValidationError's errors as lines of ``SOURCE: dotted.key: rule`` (see `blame`),
    leaving out what lies at or under a key in `skip` (already reported)."""
    lines = []
    for err in errors:
        at = _join(prefix, dotted(tuple(err.get("loc", ()))))
        for keys, text in _problems(err, at):
            if any(_within(_plain(k), s) for k in keys if k for s in skip):
                continue
            lines.append(f"{blame_keys(where, keys, origins)}: {text}")
    return lines


def _non_finite(node: Any, path: str) -> Iterator[tuple[str, float]]:
    if path in FREE_FORM:
        return
    if isinstance(node, float) and not math.isfinite(node):
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _non_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _non_finite(v, f"{path}[{i}]")


def non_finite(raw: dict[str, Any], where: str, origins: Origins) -> tuple[list[str], list[str]]:
    """Every number in the config is finite (NaN and infinity are never a valid setting:
    a bound compared with NaN is always false, an infinite time overflows what is derived
    from it): (the keys that are not, a line for each naming it)."""
    found = list(_non_finite(raw, ""))
    lines = [f"{blame(where, k, origins)}: must be a finite number, got {v}" for k, v in found]
    return [k for k, _ in found], lines
