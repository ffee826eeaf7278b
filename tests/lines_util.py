"""Where a config error places a key, found independently of robotd: the first line of the
file that starts with the given text (after a line that starts with `after`, if given)."""

from __future__ import annotations

from pathlib import Path


def at(path: Path | str, starts: str, after: str = "") -> str:
    """`FILE:LINE` of the first line of `path` that starts with `starts` (leading blanks
    ignored), below the first line that starts with `after` when it is given: as a config
    error names the key that line gives."""
    seen = not after
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.lstrip()
        if seen and text.startswith(starts):
            return f"{path}:{n}"
        seen = seen or text.startswith(after)
    raise AssertionError(f"{path}: no line starts with {starts!r} (after {after!r})")
