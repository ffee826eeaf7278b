"""A bounded memory of recent keys: what a wire peer's ids are checked against later (a
reply to a request given up, an answer to an upload whose episode ended), kept without
growing whatever the peer does."""

from __future__ import annotations

from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    """The last `keep` keys added, each with a value; the oldest is forgotten first. O(1)
    per call (a dict's insertion order is the age order)."""

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"Recent: keep must be >= 1, got {keep!r}")
        self.keep = keep
        self._items: dict[K, V] = {}

    def add(self, key: K, value: V) -> None:
        """Remember `key` (a key remembered already keeps its first value and age)."""
        if key in self._items:
            return
        self._items[key] = value
        if len(self._items) > self.keep:
            del self._items[next(iter(self._items))]

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def pop(self, key: K) -> V | None:
        """Forget `key`; its value, None when it was not remembered."""
        return self._items.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
