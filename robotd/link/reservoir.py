"""A bounded uniform sample of a long stream of numbers (Algorithm R), for percentiles over a
whole run without memory that grows with it."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np


class Reservoir:
    """Keeps at most `size` values, each value seen equally likely to be among them; `seen`
    and `total` (hence `mean`) cover every value added. Iterating yields the sample."""

    def __init__(self, size: int = 100_000, seed: int = 0) -> None:
        if size < 1:
            raise ValueError(f"reservoir size {size} must be >= 1")
        self.size = size
        self.seen = 0
        self.total = 0.0
        self.values: list[float] = []
        self._rng = random.Random(seed)

    def add(self, value: float) -> None:
        self.seen += 1
        self.total += value
        if len(self.values) < self.size:
            self.values.append(value)
        else:
            j = self._rng.randrange(self.seen)
            if j < self.size:
                self.values[j] = value

    def mean(self) -> float:
        return self.total / self.seen if self.seen else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.values, q)) if self.values else 0.0

    def __iter__(self) -> Iterator[float]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)
