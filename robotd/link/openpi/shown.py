"""What the openpi link's status shows: `LinkState`, its snapshot, and the server's metadata
in it made JSON-safe and small whatever the server sent (status goes to every robotctl and
telemetry subscriber; a server's metadata may be megabytes)."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

MAX_SHOWN = 256  # values shown in all


@dataclass(frozen=True)
class LinkState:
    """A snapshot for status: `connected`; `reconnecting_since` (time.time() when the link
    lost or had not yet made its connection, None while connected); `last_error` (the
    newest failure, kept after a reconnect); `connects` (connections made); `acts`
    (replies received); `unknown_replies` (frames that answered no request, over every
    connection); `metadata` (the server's, JSON-safe, None before the first)."""

    endpoint: str
    connected: bool = False
    reconnecting_since: float | None = None
    last_error: str = ""
    connects: int = 0
    acts: int = 0
    unknown_replies: int = 0
    metadata: Any = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
