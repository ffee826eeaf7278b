"""robotd.repeats: a repeating trouble is said at once, then once a period with its count."""

from __future__ import annotations

import math

import pytest

from robotd import repeats
from robotd.repeats import Repeats, Said


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_first_report_is_said_then_the_period_counts_the_rest() -> None:
    clock = Clock()
    r = Repeats(10.0, clock=clock)
    first = r.say("driver_error")
    assert first is not None and first.unsaid == 0 and math.isinf(first.since_s)
    for _ in range(7):
        clock.t += 1.0
        assert r.say("driver_error") is None
    clock.t += 3.0  # 10 s after the first line
    assert r.say("driver_error") == Said(7, 10.0)
    assert r.say("driver_error") is None  # the period starts again at the line just said


def test_kinds_are_counted_apart() -> None:
    clock = Clock()
    r = Repeats(5.0, clock=clock)
    assert r.say("a") is not None and r.say("b") is not None
    assert r.say("a") is None and r.say("a") is None and r.say("b") is None
    clock.t += 5.0
    assert r.say("a") == Said(2, 5.0) and r.say("b") == Said(1, 5.0)


def test_kinds_are_bounded_the_oldest_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repeats, "MAX_KINDS", 3)
    clock = Clock()
    r = Repeats(60.0, clock=clock)
    for kind in "abc":
        assert r.say(kind) is not None
    assert r.say("a") is None  # still remembered, counted
    assert r.say("d") is not None  # a fourth kind forgets the one said longest ago: a
    assert r.say("b") is None and r.say("c") is None and r.say("d") is None
    again = r.say("a")  # forgotten, so said again as new
    assert again is not None and math.isinf(again.since_s)
    assert len(r._kinds) == 3


def test_a_negative_or_nan_period_is_refused() -> None:
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="every_s"):
            Repeats(bad)


def test_the_tail_of_a_line_says_how_many_went_unsaid_in_one_wording() -> None:
    """Every repeated line ends alike (runtime events, dropped replies, lost connections,
    refused uploads and answers): robotd.repeats.Said.tail."""
    assert Said(0, math.inf).tail == ""  # the first line: nothing went unsaid
    assert Said(0, 12.0).tail == ""
    assert Said(7, 10.0).tail == " (+7 more in the last 10 s)"
    assert Said(1, 0.4).tail == " (+1 more in the last 1 s)"
