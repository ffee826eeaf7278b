"""An ask that will get no chunk: the one way both policy links (robotd's and openpi's)
count it and tell the control lane."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from robotd.lane.messages import ActFailed
from robotd.link.steps import LinkCounters
from robotd.repeats import Burst

log = logging.getLogger("robotd.link")

# A worker that refuses every act is asked again every 0.5 s (the lane's back-off) for as
# long as it refuses: each failure is counted and told down, but the log says at most
# SAID_PER_WINDOW of them each WINDOW_S, the next line with how many went unsaid.
SAID_PER_WINDOW = 5
WINDOW_S = 10.0
_SAID = Burst(SAID_PER_WINDOW, WINDOW_S)


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
    said = _SAID.say()
    if said is not None:
        log.warning("ask %d: %s%s", ask_id, reason, said.tail)
    send_down(ActFailed(ask_id, reason[:500]))
