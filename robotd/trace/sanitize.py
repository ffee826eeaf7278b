"""Values off a wire as the trace can hold them (JSON), whatever a client sent.

An operator request is validated for what it means, not for what JSON can hold: msgpack
lets a map key be bytes and a value be bytes (`params set` passes its keys and values on to
the worker, which judges them), and JSON has neither. Such a request must still be
recorded, not lost to an encoding error in the writer thread, so it is written with the
unencodable parts made printable and marked:

- a bytes key becomes the string ``"bytes:HEX"`` (a key that is neither a string nor bytes,
  ``"repr:…"``); a key that then collides with another gets ``#2``, ``#3``…;
- a bytes value becomes ``{"bytes": "HEX"}``, any other value JSON has no form for
  ``{"repr": "…"}``;

and `sanitized` lists where (JSON pointers into the result, at most MAX_NOTED, then a
count of the rest). Nothing here raises, whatever it is given.
"""

from __future__ import annotations

from typing import Any

MAX_NOTED = 16  # places listed; a request is bounded (16 KiB), the list more so
MAX_DEPTH = 32  # deeper than any validated request; a guard, not a rule
MAX_REPR = 200
_PLAIN = (str, int, float, bool, type(None))


def _pointer(path: str, key: str) -> str:
    return f"{path}/{key.replace('~', '~0').replace('/', '~1')}"


class _Walk:
    def __init__(self) -> None:
        self.places: list[str] = []
        self.seen: set[str] = set()  # a renamed key whose value changed too: one place
        self.more = 0

    def note(self, where: str) -> None:
        if where in self.seen:
            return
        self.seen.add(where)
        if len(self.places) < MAX_NOTED:
            self.places.append(where)
        else:
            self.more += 1

    def value(self, v: Any, path: str, depth: int) -> Any:
        if isinstance(v, _PLAIN):
            return v
        if isinstance(v, bytes | bytearray | memoryview):
            self.note(path)
            return {"bytes": bytes(v).hex()}
        if depth < MAX_DEPTH and isinstance(v, dict):
            return self.mapping(v, path, depth + 1)
        if depth < MAX_DEPTH and isinstance(v, list | tuple):
            return [self.value(x, f"{path}/{i}", depth + 1) for i, x in enumerate(v)]
        self.note(path)
        return {"repr": _repr(v)}

    def mapping(self, m: dict[Any, Any], path: str, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        renamed: list[str] = []
        # plain string keys first: a marked key must never take a name the client sent
        for k, v in sorted(m.items(), key=lambda kv: not isinstance(kv[0], str)):
            name = k if isinstance(k, str) else _key(k)
            if name in out:
                n = 2
                while f"{name}#{n}" in out:
                    n += 1
                name = f"{name}#{n}"
            if not isinstance(k, str) or name != k:
                renamed.append(name)
            out[name] = self.value(v, _pointer(path, name), depth)
        for name in renamed:
            self.note(_pointer(path, name))
        return out


def _repr(v: Any) -> str:
    try:
        text = repr(v)
    except Exception:  # a hostile __repr__: the type is all there is to say
        text = f"<{type(v).__name__}>"
    return text[:MAX_REPR]


def _key(k: Any) -> str:
    if isinstance(k, bytes | bytearray | memoryview):
        return f"bytes:{bytes(k).hex()}"
    return f"repr:{_repr(k)}"


def sanitized(value: Any) -> tuple[Any, list[str]]:
    """(`value` as plain JSON data, where it was changed: [] when it was already)."""
    walk = _Walk()
    out = walk.value(value, "", 0)
    if walk.more:
        walk.places.append(f"… {walk.more} more")
    return out, walk.places
