"""The server's metadata as status shows it: JSON-safe and small whatever the server sent
(status goes to every robotctl and telemetry subscriber; a server's metadata may be
megabytes)."""

from __future__ import annotations

import itertools
from typing import Any

MAX_SHOWN = 256  # values shown in all


def json_safe(value: Any) -> Any:
    """`value` made JSON-safe: arrays and bytes described, strings, lists and maps cut
    short, nesting cut at 5 levels, at most MAX_SHOWN values in all."""
    return _safe(value, 0, [MAX_SHOWN])


def _safe(value: Any, depth: int, left: list[int]) -> Any:
    left[0] -= 1
    if depth > 4 or left[0] < 0:
        return "..."
    if isinstance(value, dict):
        items = itertools.islice(value.items(), 32)
        return {_key(k): _safe(v, depth + 1, left) for k, v in items if left[0] > 0}
    if isinstance(value, list):
        return [_safe(v, depth + 1, left) for v in value[:32] if left[0] > 0]
    if isinstance(value, str):
        return value[:200]
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        if getattr(value, "ndim", 1) == 0:
            return value.item()
        return f"<array {value.dtype} {list(value.shape)}>"
    return value if isinstance(value, bool | int | float | type(None)) else repr(value)[:200]


def _key(k: Any) -> str:
    return k.decode("utf-8", "replace")[:100] if isinstance(k, bytes) else str(k)[:100]
