"""A worker that refuses every act is asked again twice a second for as long as it refuses:
every failure is counted and told to the control lane, but the log says a few per window,
then how many went unsaid (robotd.link.failures.fail_ask)."""

from __future__ import annotations

import logging

import pytest

from robotd.lane.messages import ActFailed
from robotd.link import failures
from robotd.link.steps import LinkCounters
from robotd.repeats import Burst


def test_every_failure_is_counted_and_told_down_but_the_log_says_a_few(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    monkeypatch.setattr(failures, "_SAID", {})
    monkeypatch.setattr(failures, "Burst", lambda n, s: Burst(n, s, clock=lambda: now[0]))
    counters, down = LinkCounters(), []
    caplog.set_level(logging.WARNING, "robotd.link")
    for ask in range(100):  # 5 s of asks every 0.05 s
        now[0] = ask * 0.05
        failures.fail_ask(counters, down.append, ask, "act failed: bad_actions", stopping=False)
    assert counters.act_errors == 100
    assert [m.ask for m in down if isinstance(m, ActFailed)] == list(range(100))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"ask {i}: act failed: bad_actions" for i in range(5)]
    now[0] = 10.0  # the next window: the next failure says how many went unsaid
    failures.fail_ask(counters, down.append, 100, "act failed: bad_actions", stopping=False)
    assert caplog.records[-1].getMessage() == (
        "ask 100: act failed: bad_actions (+95 more in the last 10 s)"
    )
    # another kind of failure is said at once, however the first floods
    for ask in range(101, 120):
        failures.fail_ask(counters, down.append, ask, "act failed: x", stopping=False)
    failures.fail_ask(counters, down.append, 120, "chunk refused: row 2", stopping=False)
    assert caplog.records[-1].getMessage() == "ask 120: chunk refused: row 2"
