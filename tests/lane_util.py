"""Lane messages as plain dicts for assertions: the tag as "k", an event's details beside
its name, a merge report's first step also as "from" (its wire name before typing)."""

from __future__ import annotations

from typing import Any

import msgspec

from robotd.lane import codec


def plain(msg: Any) -> dict[str, Any]:
    out = msgspec.to_builtins(msg)
    if out.get("k") == "event":
        out.update(out.pop("detail", {}))
    if out.get("k") == "merged":
        out["from"] = out["from_step"]
    return out


def recv_all(sock: Any, timeout_ms: int = 200) -> list[dict[str, Any]]:
    """Every message waiting on a PULL socket of the control lane's up channel, as dicts."""
    out = []
    while sock.poll(timeout_ms):
        out.extend(plain(m) for m in codec.decode_up_batch(sock.recv()))
    return out
