"""An ask that will get no chunk: the one way both policy links (robotd's and openpi's)
count it and tell the control lane."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from robotd.lane.messages import ActFailed
from robotd.link.steps import LinkCounters
from robotd.repeats import Burst, Said

log = logging.getLogger("robotd.link")

# A worker that refuses every act is asked again every 0.5 s (the lane's back-off) for as
# long as it refuses: each failure is counted and told down, but the log says at most
# SAID_PER_WINDOW of each kind (the reason up to its first ':') each WINDOW_S, the next line
# with how many went unsaid; a new kind is said at once, however long the last one floods.
SAID_PER_WINDOW = 5
WINDOW_S = 10.0
MAX_KINDS = 32  # kinds remembered; the oldest is forgotten past it
_SAID: dict[str, Burst] = {}


def _said(reason: str) -> Said | None:
    kind = reason.split(":", 1)[0][:80]
    burst = _SAID.pop(kind, None)
    if burst is None:
        if len(_SAID) >= MAX_KINDS:
            del _SAID[next(iter(_SAID))]
        burst = Burst(SAID_PER_WINDOW, WINDOW_S)
    _SAID[kind] = burst  # re-inserted last: the dict's order is the age order
    return burst.say()


def fail_ask(
    counters: LinkCounters,
    send_down: Callable[[Any], None],
    ask_id: int,
    reason: str,
    *,
    stopping: bool,
) -> None:
    """Counted as an act error and told down (ActFailed), unless the daemon's own stop cut
    the act short (`stopping`): that is not the policy's failure, and is only logged."""
    if stopping:
        log.info("ask %d: not answered before the daemon stopped", ask_id)
        return
    counters.act_errors += 1
    said = _said(reason)
    if said is not None:
        log.warning("ask %d: %s%s", ask_id, reason, said.tail)
    send_down(ActFailed(ask_id, reason[:500]))
