"""The line of a TOML file that gives a key, so that a config error reads
``FILE:LINE: key.path: rule`` as a compiler's does (editors and terminals jump to it).

tomllib reports no positions, and a hand-written TOML scanner would be a second parser to
get wrong (multi-line strings and arrays, quoted and dotted keys, inline tables). So the
line is found by tomllib itself: the text is parsed a line prefix at a time, and a key's
line is that of the first prefix that holds it (a prefix that stops inside a multi-line
value does not parse and is passed over; the value's key then lands on the line that
closes it). A key the file lacks (a required one) is placed at the nearest table above it
that the file has. This runs only on the error path, and only for files of at most
MAX_LINES lines: the parses cost the square of the file's length.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from typing import Any

MAX_LINES = 300  # a robot's config is tens of lines (300: about 0.2 s of parses, on errors only)

# A key path as errors spell it: dotted names, [i] indices, a name in brackets and quotes.
_KEY = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+|\[\d+\]|\['[^']*'\])*")


def key_lines(text: str) -> dict[str, int]:
    """{dotted key path: 1-based line} for every table, array entry and value in `text`;
    empty for a file over MAX_LINES lines (or one that never parses)."""
    lines = text.splitlines(keepends=True)
    if len(lines) > MAX_LINES:
        return {}
    found: dict[str, int] = {}
    prefix = ""
    for n, line in enumerate(lines, 1):
        prefix += line
        try:
            parsed = tomllib.loads(prefix)
        except (tomllib.TOMLDecodeError, RecursionError):
            continue
        for key in _paths(parsed, ""):
            found.setdefault(key, n)
    return found


def _paths(node: Any, at: str) -> Iterator[str]:
    """Every key path under `node` (itself included when it has one), as `dotted` spells
    them: a.b, a[0].b."""
    if at:
        yield at
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, f"{at}.{k}" if at else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, f"{at}[{i}]")


def line_of(key: str, lines: Mapping[str, int]) -> int | None:
    """The line that gives `key`, or the nearest table above it the file has; None when
    the file has none of them (a key and its tables all missing, or no lines known)."""
    while key:
        if key in lines:
            return lines[key]
        cut = max(key.rfind("."), key.rfind("["))
        key = key[:cut] if cut > 0 else ""
    return None


def with_lines(message: str, where: str, text: str) -> str:
    """`message` (lines of ``WHERE: KEY: rule``) with each line about a key of the file
    `where` placed: ``WHERE:LINE: KEY: rule``. Lines about a --set, or none the file can
    place, are left as they are; never raises (a message is worth more than its lines)."""
    head = f"{where}: "
    try:
        lines: dict[str, int] | None = None
        out = []
        for line in message.split("\n"):
            match = _KEY.match(line, len(head)) if line.startswith(head) else None
            if match is None or not line.startswith(": ", match.end()):
                out.append(line)
                continue
            if lines is None:
                lines = key_lines(text)
            n = line_of(match.group(0), lines)
            out.append(line if n is None else f"{where}:{n}: {line[len(head) :]}")
        return "\n".join(out)
    except Exception:  # any failure here costs the line numbers, never the error
        return message
