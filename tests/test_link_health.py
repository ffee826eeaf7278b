"""The policy link's reconnect backoff survives a reconnect and starts over only once an
act was answered: a server that takes every connection and fails every act (a config
mistake it cannot serve) is retried ever more rarely, not twice a second forever."""

from __future__ import annotations

from robotd.link.health import BACKOFF_FIRST_S, LinkHealth


def _clock() -> tuple[list[float], LinkHealth]:
    now = [0.0]
    return now, LinkHealth(backoff_max_s=5.0, clock=lambda: now[0])


def test_a_link_that_connects_and_fails_every_act_backs_off_across_reconnects() -> None:
    now, h = _clock()
    h.up()
    delays = []
    for _ in range(7):  # connect, the act fails, gone; reconnect after the delay
        h.gone("the act failed")
        delays.append(h.retry_delay())
        now[0] += delays[-1]
        h.up()
    assert delays == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert h.reconnects == 7


def test_an_answered_act_starts_the_backoff_over() -> None:
    _, h = _clock()
    h.up()
    for _ in range(4):
        h.gone("outage")
        h.retry_delay()
        h.up()
    h.served()  # an act's answer was merged: the link works
    h.gone("another outage")
    assert h.retry_delay() == BACKOFF_FIRST_S
