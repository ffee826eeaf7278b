"""LatencyHistogram against numpy on random data, merge, wire round trip, edge cases."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from robotd.control.histogram import HistogramData, LatencyHistogram

# half a bucket (1/64) at the sample, plus the gap between neighbouring order statistics
REL_TOL = 0.03


def _fill(values: np.ndarray) -> LatencyHistogram:
    h = LatencyHistogram()
    for v in values:
        h.add(int(v))
    return h


@pytest.mark.parametrize(
    "sampler",
    [
        lambda rng: rng.lognormal(mean=np.log(20_000), sigma=1.0, size=20_000),  # ~20 µs
        lambda rng: rng.uniform(1_000, 900_000_000, size=20_000),  # 1 µs .. 0.9 s
        lambda rng: rng.exponential(300_000, size=20_000) + 2_000,
    ],
)
def test_percentiles_match_numpy_within_bucket_resolution(sampler) -> None:
    rng = np.random.default_rng(7)
    values = np.asarray(sampler(rng)).astype(np.int64)
    values = values[values >= 1_000]
    h = _fill(values)
    assert h.count == len(values)
    for q in (1, 10, 50, 90, 99, 99.9):
        want = np.percentile(values, q, method="inverted_cdf") / 1000.0  # nearest rank
        got = h.percentile(q)
        assert abs(got - want) <= REL_TOL * want, (q, got, want)
        # numpy's default interpolates between the two order statistics around q; the
        # nearest-rank value is one of them, so the answer lies in that bracket
        lower = np.percentile(values, q, method="lower") / 1000.0
        higher = np.percentile(values, q, method="higher") / 1000.0
        assert lower <= np.percentile(values, q) / 1000.0 <= higher
        assert lower * (1 - REL_TOL) <= got <= higher * (1 + REL_TOL), (q, got, lower, higher)


def test_summary_max_and_extremes_are_exact() -> None:
    rng = np.random.default_rng(3)
    values = rng.integers(1_000, 5_000_000, size=5_000)
    h = _fill(values)
    s = h.summary()
    assert set(s) == {"p50", "p99", "p999", "max"}
    assert all(isinstance(v, float) for v in s.values())
    assert s["max"] == values.max() / 1000.0
    assert h.max_ns == values.max() and h.min_ns == values.min()
    assert h.percentile(100) == values.max() / 1000.0
    assert h.percentile(0) >= values.min() / 1000.0
    assert s["p50"] <= s["p99"] <= s["p999"] <= s["max"]
    assert h.mean_us() == pytest.approx(values.mean() / 1000.0)


def test_single_value_and_tiny_and_huge_values() -> None:
    h = LatencyHistogram()
    h.add(12_345)
    assert h.percentile(50) == 12.345  # clamped to the exact min == max
    h = LatencyHistogram()
    for v in (-5, 0, 3, 999):
        h.add(v)
    assert h.min_ns == 0 and h.max_ns == 999
    assert 0.0 <= h.percentile(50) <= 0.999
    h.add(5_000_000_000)  # 5 s: beyond the buckets, still counted, max exact
    assert h.count == 5
    assert h.percentile(100) == 5_000_000.0
    assert h.summary()["max"] == 5_000_000.0


def test_empty_histogram() -> None:
    h = LatencyHistogram()
    assert h.count == 0
    assert h.summary() == {"p50": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0}
    assert h.percentile(99) == 0.0 and h.mean_us() == 0.0
    back = LatencyHistogram.from_data(h.data())
    assert back.count == 0 and back.summary() == h.summary()


@pytest.mark.parametrize("q", [-1, 100.5])
def test_bad_percentile(q: float) -> None:
    with pytest.raises(ValueError, match=r"q must be in 0\.\.100"):
        LatencyHistogram().percentile(q)


def test_merge_equals_adding_everything() -> None:
    rng = np.random.default_rng(11)
    a_vals = rng.integers(1_000, 2_000_000, size=3_000)
    b_vals = rng.integers(500, 80_000_000, size=2_000)
    a, b = _fill(a_vals), _fill(b_vals)
    both = _fill(np.concatenate([a_vals, b_vals]))
    a.merge(b)
    assert a.counts == both.counts
    assert (a.count, a.min_ns, a.max_ns, a.total_ns) == (
        both.count,
        both.min_ns,
        both.max_ns,
        both.total_ns,
    )
    assert a.summary() == both.summary()
    empty = LatencyHistogram()
    empty.merge(b)
    assert empty.summary() == b.summary() and empty.min_ns == b.min_ns
    b.merge(LatencyHistogram())
    assert b.count == 2_000
    with pytest.raises(TypeError, match="LatencyHistogram"):
        a.merge({"count": 1})  # type: ignore[arg-type]


def test_reset() -> None:
    h = _fill(np.arange(1_000, 50_000, 7))
    h.reset()
    assert h.count == 0 and h.max_ns == 0 and sum(h.counts) == 0
    h.add(2_000)
    assert h.summary()["max"] == 2.0


def _through_the_wire(data: HistogramData) -> HistogramData:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(data), type=HistogramData)


def test_round_trip_through_the_lane_codec() -> None:
    rng = np.random.default_rng(5)
    h = _fill(rng.integers(1_000, 30_000_000, size=4_000))
    packed = msgspec.msgpack.encode(h.data())
    back = LatencyHistogram.from_data(_through_the_wire(h.data()))
    assert back.counts == h.counts
    assert (back.count, back.min_ns, back.max_ns, back.total_ns) == (
        h.count,
        h.min_ns,
        h.max_ns,
        h.total_ns,
    )
    assert back.summary() == h.summary()
    assert len(packed) < 4_000  # sparse: only non-empty buckets travel
    assert LatencyHistogram.from_data(None).count == 0


def test_data_walks_only_touched_buckets_and_reset_clears_them() -> None:
    h = LatencyHistogram()
    for ns in (5_000, 5_000, 70_000, 3_000_000):
        h.add(ns)
    assert [c for _, c in h.data().buckets] == [2, 1, 1]
    h.reset()
    assert h.data().buckets == [] and sum(h.counts) == 0
    h.add(70_000)
    assert len(h.data().buckets) == 1


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.buckets.append((10_000, 1)), r"buckets\[\d+\]"),
        (lambda d: d.buckets.append((3, 0)), r"buckets\[\d+\]"),
        (lambda d: setattr(d, "count", d.count + 1), "sum of bucket counts"),
        (lambda d: setattr(d, "min_ns", d.max_ns + 1), "min_ns"),
    ],
)
def test_from_data_rejects_bad_data(mutate, message: str) -> None:
    data = _fill(np.arange(1_000, 20_000, 100)).data()
    mutate(data)
    with pytest.raises(ValueError, match=message):
        LatencyHistogram.from_data(data)


@pytest.mark.parametrize(
    "raw",
    [
        [[[1, 2]], 1, 0, "7", 0],  # max_ns not an int
        ["x", 0, 0, 0, 0],  # buckets not a list
        [[[3]], 1, 0, 0, 0],  # a bucket without its count
        {"buckets": []},  # not the array form
    ],
)
def test_the_codec_refuses_malformed_histograms(raw) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(raw), type=HistogramData)


def test_bucket_relative_width_is_small() -> None:
    # every value from 1 µs to ~1 s is reported within 1/64 of itself (half a bucket)
    for ns in np.geomspace(1_000, 1_000_000_000, 500).astype(np.int64):
        h = LatencyHistogram()
        h.add(int(ns))
        h.add(int(ns) * 4)  # so the clamp to min/max does not hide the bucket midpoint
        assert abs(h.percentile(50) * 1000 - ns) <= ns / 64 + 1
