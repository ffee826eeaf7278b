"""`--set KEY=VALUE` overrides and who is to blame for a bad value: an error at a key a
--set gave (or inside a table a --set made) names the --set, not the file.

Also the one check every number of the config passes before its section's model sees
it: finite (no NaN, no infinity), so that NaN is not reported as "must be <= 2000".
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from robotd.errors import ConfigError, dotted, rule

# Where a --set put something: the key it set, and each table it had to make on the way,
# mapped to the --set key (the source named in errors).
Origins = dict[str, str]

# Tables whose values are not robotd's: the policy's constructor arguments (the policy's own
# business, infinity included).
FREE_FORM = ("policy.args",)


def parse_value(text: str) -> Any:
    """A --set value in TOML syntax; a bare word that is not TOML is taken as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(raw: dict[str, Any], assignment: str, origins: Origins) -> str:
    """Set one dotted key from KEY=VALUE and record it (and each table it made) in
    `origins`; returns the key."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE (e.g. control.hz=100)")
    key, _, text = assignment.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {assignment!r}: empty part in key path {key!r}")
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
    node[parts[-1]] = parse_value(text.strip())
    origins[full] = full
    return full


def _within(key: str, path: str) -> bool:
    return key == path or key.startswith((path + ".", path + "["))


def blame(where: str, key: str, origins: Origins) -> str:
    """How an error names a key: ``--set KEY`` when a --set gave it, ``--set SRC: KEY``
    when it lies in a table a --set made, else ``FILE: KEY``."""
    for path, source in sorted(origins.items(), key=lambda item: -len(item[0])):
        if not key or not _within(key, path):
            continue
        if path == source:
            return f"--set {key}"
        return f"--set {source}: {key}"
    return f"{where}: {key}" if key else where


# A model-wide rule's message that starts with the key it is about ("safety.x: needs ...")
_LEADING_KEY = re.compile(r"([A-Za-z_][\w\-]*(?:\.[\w\-]+|\[\d+\])*): ")


def error_lines(exc: ValidationError, where: str, origins: Origins, prefix: str = "") -> str:
    """A ValidationError as lines of ``SOURCE: dotted.key: rule`` (see `blame`)."""
    lines = []
    for err in exc.errors():
        at = dotted(tuple(err.get("loc", ())))
        at = f"{prefix}.{at}" if prefix and at else prefix or at
        text = rule(err)
        if err.get("type") == "finite_number":
            text = f"must be a finite number, got {err.get('input')!r:.60}"
        lead = _LEADING_KEY.match(text)
        if lead is not None and not at:  # a rule spanning sections names its own key
            key = lead.group(1)
            lines.append(f"{blame(where, key, origins)}: {text[lead.end() :]}")
            continue
        lines.append(f"{blame(where, at, origins)}: {text}")
    return "\n".join(lines)


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


def check_finite(raw: dict[str, Any], where: str, origins: Origins) -> None:
    """Every number in the config is finite (NaN and infinity are never a valid setting:
    a bound compared with NaN is always false, an infinite time overflows what is derived
    from it); ConfigError naming each key that is not."""
    bad = [
        f"{blame(where, key, origins)}: must be a finite number, got {value}"
        for key, value in _non_finite(raw, "")
    ]
    if bad:
        raise ConfigError("\n".join(bad))
