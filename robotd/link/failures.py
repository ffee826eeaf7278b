"""An ask that will get no chunk: the one way both policy links (robotd's and openpi's)
count it and tell the control lane."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from robotd.lane.messages import ActFailed
from robotd.link.steps import LinkCounters

log = logging.getLogger("robotd.link")


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
    log.warning("ask %d: %s", ask_id, reason)
    send_down(ActFailed(ask_id, reason[:500]))
