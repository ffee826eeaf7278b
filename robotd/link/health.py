"""The policy link's health: up or gone (since when, why), the reconnect backoff, and the
counters the summary and telemetry show. Pure bookkeeping on an injectable clock; the
policy session acts on it. Every change of state is logged once, with its reason."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from robotd.lane.messages import Status

log = logging.getLogger("robotd.link")

BACKOFF_FIRST_S = 0.2


class LinkHealth:
    """`up()` and `gone(reason)` move between the states; `retry_delay()` is the capped
    exponential backoff between reconnect attempts, kept across reconnects until `served()`
    (an act answered and merged) starts it over; `failed(reason)` notes an attempt that
    did not connect (logged only when its reason changes)."""

    def __init__(self, backoff_max_s: float, clock: Callable[[], float] = time.monotonic):
        self.backoff_max_s = backoff_max_s
        self.clock = clock
        self.state = "connecting"
        self.reason = ""
        self.since = clock()
        self.reconnects = 0
        self.losses = 0
        self.gone_total_s = 0.0
        self._delay = BACKOFF_FIRST_S
        self._last_failure = ""

    @property
    def is_up(self) -> bool:
        return self.state == "up"

    def up(self) -> float:
        """Connected; returns how long it had been gone (0 at the first connect)."""
        now = self.clock()
        away = now - self.since if self.state == "gone" else 0.0
        if self.state == "gone":
            self.gone_total_s += away
            self.reconnects += 1
        # the backoff is not reset here: a server that takes the connection and then fails
        # every act would be reconnected to twice a second forever; `served` resets it
        self.state, self.reason, self.since = "up", "", now
        self._last_failure = ""
        return away

    def served(self) -> None:
        """An act's answer was merged: the link works, so the next loss backs off from the
        start again."""
        self._delay = BACKOFF_FIRST_S

    def gone(self, reason: str) -> bool:
        """The worker is gone or unusable; True when this is news (it was up)."""
        if self.state == "gone":
            return False
        self.state, self.reason, self.since = "gone", reason, self.clock()
        self.losses += 1
        return True

    def failed(self, reason: str, *, answers: bool = False) -> None:
        """A reconnect attempt failed; logged when the reason is not the last one's.
        `answers`: the worker answered, but what it said cannot be used (its contract)."""
        if reason != self._last_failure:
            self._last_failure = reason
            if answers:
                log.warning("policy worker answers, but %s; retrying", reason)
            else:
                log.warning("policy worker still unreachable (%s); retrying", reason)

    def retry_delay(self) -> float:
        """The wait before the next attempt: doubling from 0.2 s up to backoff_max_s."""
        delay = self._delay
        self._delay = min(self.backoff_max_s, self._delay * 2)
        return delay

    def gone_s(self) -> float:
        """Seconds gone so far (0 when up)."""
        return self.clock() - self.since if self.state == "gone" else 0.0

    def as_dict(self) -> dict[str, Any]:
        """For status and telemetry: the state, since how long, why, and the counts."""
        return {
            "state": self.state,
            "for_s": round(self.clock() - self.since, 1),
            "reason": self.reason,
            # while gone: why the last attempt to bring it back failed (a refused contract
            # is not a worker that is away, and the operator should see which it is)
            "not_back": self._last_failure if self.state == "gone" else "",
            "reconnects": self.reconnects,
            "worker_gone_s": round(self.gone_total_s + self.gone_s(), 1),
        }


def back_words(st: Status | None, gone_ep: int) -> str:
    """What a worker back acts on, by the lane's state `st` now; `gone_ep` the operator
    episode that ran when it went (0: none), which may have ended meanwhile (starved,
    stopped, a fault)."""
    if st is None:
        return "the control lane's state is not known yet"
    if st.state == "RUNNING" and st.episode == gone_ep:
        return f"episode {st.episode} goes on in a new worker-side episode"
    if st.state == "RUNNING":
        return f"episode {st.episode}, started while it was away, is served from now on"
    after = {"FAULT": " (once the fault is cleared)", "IDLE": ""}.get(
        st.state, " (after reset_done)"
    )
    ended = f"episode {gone_ep} ended while it was away; " if gone_ep else ""
    return f"{ended}no episode is running ({st.state}): the next start{after} acts on it"
