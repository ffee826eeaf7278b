"""The replies a policy client drops, never handed to a request: counted by kind, logged at
once and then at most every DROPPED_QUIET_S per kind, and told apart by a bounded memory
of the requests settled (robotd.link.client).

A reply is late when it answers a request given up (timed out, its connection lost; a
heartbeat ping's counted apart: the worker slow to answer one, not an answer lost), a
duplicate when its request was answered already, unknown when it names no request of
ours, undecodable when its bytes are no message at all.
"""

from __future__ import annotations

import logging
from typing import Any

from robotd.recent import Recent
from robotd.repeats import Repeats

log = logging.getLogger("robotd.link")
DROPPED_QUIET_S = 10.0
# ids of requests settled, kept to tell a late reply (to one given up) or a duplicate (to
# one answered) from one naming no request of ours
SETTLED_KEPT = 256
# the kinds counted: "late" answers a request given up, but for a heartbeat ping's
DROPPED_KINDS = ("late", "late_ping", "unknown", "duplicate", "undecodable")


class DroppedReplies:
    """What one client to `endpoint` dropped. `settled(rid, cmd, answered)` is told of every
    request as it ends; `drop` judges a reply no request waits for."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.counts = dict.fromkeys(DROPPED_KINDS, 0)
        self._said = Repeats(DROPPED_QUIET_S)  # the log lines, per kind
        # request id -> its cmd: given up (a reply may still come, late), or answered (a
        # second reply is a duplicate)
        self._abandoned: Recent[int, str] = Recent(SETTLED_KEPT)
        self._answered: Recent[int, str] = Recent(SETTLED_KEPT)

    def settled(self, rid: int, cmd: str, *, answered: bool) -> None:
        """Request `rid` (a `cmd`) ended: answered, or given up (a reply may still come)."""
        (self._answered if answered else self._abandoned).add(rid, cmd)

    def undecodable(self, err: Exception) -> None:
        n = self._count("undecodable")
        self._say("undecodable", "dropped an undecodable reply from %s: %s (%d so far)", err, n)

    def drop(self, named: Any, rid: int | None, waiting: str | None, answered: bool) -> bool:
        """A decoded reply no request waits for: `named` its id as sent, `rid` that id if it
        is one, `waiting` the cmd of the request of that id still pending (settled but not
        yet woken; None when there is none) and `answered` whether a reply settled it.
        True when it is the worker answering us, late (news of its liveness)."""
        if rid is not None and (answered or rid in self._answered):
            n = self._count("duplicate")
            self._say(
                "duplicate",
                "dropped a second reply from %s: request %d was answered already (%d so far)",
                rid,
                n,
            )
            return False
        if rid is not None and (rid in self._abandoned or waiting is not None):
            cmd = waiting if waiting is not None else self._abandoned.get(rid)
            # a heartbeat's wait is short: the worker slow, no answer lost
            kind, what = ("late_ping", "heartbeat ping") if cmd == "ping" else ("late", "request")
            n = self._count(kind)
            self._say(
                kind, "dropped a late reply from %s: %s %d had been given up (%d so far)",
                what, rid, n,
            )  # fmt: skip
            return True
        n = self._count("unknown")
        self._say(
            "unknown",
            "dropped a reply from %s naming no request of ours (id %.40r; %d so far)",
            named,
            n,
        )
        return False

    def _count(self, kind: str) -> int:
        self.counts[kind] += 1
        return self.counts[kind]

    def _say(self, kind: str, text: str, *args: Any) -> None:
        """Logged at once and then at most every DROPPED_QUIET_S per kind (with how many
        went unsaid): a worker that floods replies cannot flood the log."""
        said = self._said.say(kind)
        if said is not None:
            log.warning(text + "%s", self.endpoint, *args, said.tail)
