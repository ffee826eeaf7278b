"""A fixed-size log-linear latency histogram, cheap enough to feed every control tick.

Layout (HDR-histogram style, in integer nanoseconds):
  - below 1024 ns: 32 linear buckets of 32 ns;
  - from 2**10 ns (~1 µs) up to 2**31 ns (~2.1 s): each power of two is split into
    32 equal buckets, so a bucket is at most 1/32 (3.1 %) of its lower bound wide;
  - one overflow bucket for everything larger (the exact maximum is kept apart).

``add`` is O(1) and allocates nothing that outlives the call: a bit length, a shift
and one list-slot increment. Percentiles are answered from bucket midpoints clamped
to the exact observed minimum and maximum, so they are within half a bucket (≤ 1.6 %)
of a nearest-rank percentile. Everything reported is in microseconds (floats).
"""

from __future__ import annotations

import math

import msgspec

__all__ = ["HistogramData", "LatencyHistogram"]

_SUB_BITS = 5
_SUB = 1 << _SUB_BITS  # buckets per power of two
_LOW_EXP = 10  # 2**10 ns: where the log-linear part starts
_HIGH_EXP = 30  # the last power of two bucketed: [2**30, 2**31) ns
_LINEAR_SHIFT = _LOW_EXP - _SUB_BITS  # linear bucket width below 2**10 ns: 32 ns
_N_BUCKETS = _SUB + (_HIGH_EXP - _LOW_EXP + 1) * _SUB + 1  # + overflow
_OVERFLOW = _N_BUCKETS - 1
_LIMIT_NS = 1 << (_HIGH_EXP + 1)


class HistogramData(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A histogram on the wire: (bucket, count) for each nonzero bucket, exact stats."""

    buckets: list[tuple[int, int]]
    count: int
    min_ns: int
    max_ns: int
    total_ns: int


def _bucket_of(ns: int) -> int:
    if ns < (1 << _LOW_EXP):
        return ns >> _LINEAR_SHIFT if ns > 0 else 0
    if ns >= _LIMIT_NS:
        return _OVERFLOW
    exp = ns.bit_length() - 1
    return _SUB + (exp - _LOW_EXP) * _SUB + ((ns >> (exp - _SUB_BITS)) & (_SUB - 1))


def _bucket_bounds(index: int) -> tuple[int, int]:
    """[low, high) in ns of a bucket (the overflow bucket's high is the 2**31 ns limit)."""
    if index < _SUB:
        width = 1 << _LINEAR_SHIFT
        return index * width, (index + 1) * width
    if index >= _OVERFLOW:
        return _LIMIT_NS, _LIMIT_NS
    exp = _LOW_EXP + (index - _SUB) // _SUB
    sub = (index - _SUB) % _SUB
    width = 1 << (exp - _SUB_BITS)
    low = (1 << exp) + sub * width
    return low, low + width


class LatencyHistogram:
    """Counts of latencies (integer ns) in fixed log-linear buckets.

    Contract:
      - :meth:`add` takes an int number of nanoseconds; negative values count as 0.
      - :attr:`count`, :attr:`max_ns`, :attr:`min_ns` and :attr:`total_ns` are exact.
      - :meth:`percentile` (q in 0..100) and :meth:`summary` answer in µs, within
        half a bucket of the true nearest-rank value, never outside [min, max];
        an empty histogram answers 0.0 everywhere (look at :attr:`count`).
      - :meth:`data` gives the typed lane-message form (HistogramData); :meth:`from_data`
        validates and rebuilds (a ValueError names what is wrong).
    """

    __slots__ = ("_touched", "count", "counts", "max_ns", "min_ns", "total_ns")

    def __init__(self) -> None:
        self.counts: list[int] = [0] * _N_BUCKETS
        self._touched: list[int] = []  # buckets ever nonzero, in first-touch order
        self.count = 0
        self.max_ns = 0
        self.min_ns = 0
        self.total_ns = 0

    def add(self, ns: int) -> None:
        """Record one latency in nanoseconds (O(1))."""
        if ns < 0:
            ns = 0
        b = _bucket_of(ns)
        counts = self.counts
        if not counts[b]:
            self._touched.append(b)
        counts[b] += 1
        if self.count == 0:
            self.min_ns = self.max_ns = ns
        elif ns > self.max_ns:
            self.max_ns = ns
        elif ns < self.min_ns:
            self.min_ns = ns
        self.count += 1
        self.total_ns += ns

    def reset(self) -> None:
        """Forget every sample (the bucket list is reused, not reallocated)."""
        counts = self.counts
        for i in self._touched:
            counts[i] = 0
        self._touched.clear()
        self.count = 0
        self.max_ns = 0
        self.min_ns = 0
        self.total_ns = 0

    def merge(self, other: LatencyHistogram) -> None:
        """Add every sample of ``other`` into this histogram."""
        if not isinstance(other, LatencyHistogram):
            raise TypeError(f"LatencyHistogram.merge: expected a LatencyHistogram, got {other!r}")
        if other.count == 0:
            return
        mine = self.counts
        for i in other._touched:
            if not mine[i]:
                self._touched.append(i)
            mine[i] += other.counts[i]
        if self.count == 0:
            self.min_ns, self.max_ns = other.min_ns, other.max_ns
        else:
            self.min_ns = min(self.min_ns, other.min_ns)
            self.max_ns = max(self.max_ns, other.max_ns)
        self.count += other.count
        self.total_ns += other.total_ns

    def percentile(self, q: float) -> float:
        """The q-th percentile (q in 0..100) in µs, by nearest rank at bucket resolution."""
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"LatencyHistogram.percentile: q must be in 0..100, got {q!r}")
        if self.count == 0:
            return 0.0
        # nearest rank: the smallest sample with at least q% of the samples <= it
        # (the epsilon keeps float noise such as 1000 * 99.9 = 99900.00000000001 out)
        rank = max(1, math.ceil(self.count * q / 100.0 - 1e-9))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                if i == _OVERFLOW:  # beyond the buckets: the exact max is the honest answer
                    return self.max_ns / 1000.0
                low, high = _bucket_bounds(i)
                mid = (low + high) / 2
                return min(max(mid, self.min_ns), self.max_ns) / 1000.0
        return self.max_ns / 1000.0  # unreachable: counts sum to count

    def mean_us(self) -> float:
        """The exact mean in µs (0.0 when empty)."""
        return self.total_ns / self.count / 1000.0 if self.count else 0.0

    def summary(self) -> dict[str, float]:
        """``{"p50", "p99", "p999", "max"}`` in µs (floats)."""
        return {
            "p50": self.percentile(50.0),
            "p99": self.percentile(99.0),
            "p999": self.percentile(99.9),
            "max": self.max_ns / 1000.0,
        }

    def data(self) -> HistogramData:
        """The histogram as a lane message field: the nonzero buckets (cumulative) and the
        exact stats. Cheap: it walks only the buckets ever touched, never all of them."""
        counts = self.counts
        return HistogramData(
            [(i, counts[i]) for i in self._touched],
            self.count,
            self.min_ns,
            self.max_ns,
            self.total_ns,
        )

    @classmethod
    def from_data(cls, data: HistogramData | None) -> LatencyHistogram:
        """Rebuild from :meth:`data` (None: empty); ValueError names the bad field."""
        hist = cls()
        if data is None:
            return hist
        where = "histogram"
        for n, (index, count) in enumerate(data.buckets):
            if not (0 <= index < _N_BUCKETS) or count <= 0:
                raise ValueError(
                    f"{where}: buckets[{n}] must be [index 0..{_N_BUCKETS - 1}, count > 0], "
                    f"got {[index, count]!r}"
                )
            if not hist.counts[index]:
                hist._touched.append(index)
            hist.counts[index] += count
        total = sum(hist.counts)
        if total != data.count:
            raise ValueError(f"{where}: count {data.count} != sum of bucket counts {total}")
        if data.count and data.min_ns > data.max_ns:
            raise ValueError(f"{where}: min_ns {data.min_ns} > max_ns {data.max_ns}")
        hist.count, hist.min_ns, hist.max_ns = data.count, data.min_ns, data.max_ns
        hist.total_ns = data.total_ns
        return hist

    def __repr__(self) -> str:
        s = self.summary()
        return (
            f"LatencyHistogram(count={self.count}, p50={s['p50']:.1f}us, "
            f"p99={s['p99']:.1f}us, max={s['max']:.1f}us)"
        )
