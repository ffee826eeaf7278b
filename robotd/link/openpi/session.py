"""The openpi side of a policy session: connect to the server, build the act path, and
rebuild it after a loss (each new connection is a new server-side session, so the episode
was reset when the old one was lost)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from robotd.config import Config
from robotd.link.connect import StartupError
from robotd.link.health import LinkHealth
from robotd.link.openpi.acts import OpenpiActs
from robotd.link.openpi.client import OpenpiLink
from robotd.link.openpi.errors import ConnectionLost
from robotd.link.steps import LinkCounters, RingFrames, StepReader, StepRing
from robotd.shm import FrameRing


class Session(Protocol):
    """What of the policy session (robotd.link.session) the openpi side uses."""

    cfg: Config
    endpoint: str
    steps: StepRing
    rings: Mapping[str, FrameRing]
    send_down: Callable[[Any], None]
    task: Callable[[], str]
    counters: LinkCounters

    def worker_gone(self, reason: str) -> None: ...


log = logging.getLogger("robotd.link.openpi")

CONNECT_DEADLINE_S = 30.0


@dataclass
class OpenpiPeer:
    link: OpenpiLink
    acts: OpenpiActs


async def connect_openpi(
    session: Session, *, deadline_s: float = CONNECT_DEADLINE_S, source: str = "policy.worker"
) -> OpenpiPeer:
    """The first connection to the openpi server; StartupError when there is none within
    `deadline_s` (or the endpoint or key is unusable), naming `source` (where the
    endpoint came from)."""
    cfg = session.cfg
    try:
        link = OpenpiLink(session.endpoint, cfg.policy.openpi)
    except ValueError as exc:
        raise StartupError(f"{source} {session.endpoint!r}: {exc}") from None
    try:
        await link.connect(deadline_s=deadline_s)
    except ConnectionLost as exc:
        await link.close()
        raise StartupError(f"openpi server ({source}): {exc.message}") from None
    reader = StepReader(session.steps, RingFrames(session.rings))
    acts = OpenpiActs(
        cfg,
        link,
        reader,
        session.send_down,
        task=session.task,
        on_lost=session.worker_gone,
        counters=session.counters,
    )
    session.steps.keep = acts.planner.lookback + 2 * int(cfg.control.hz) + 16
    log.info(
        "openpi server at %s (metadata: %s): inputs %s",
        session.endpoint,
        list(link.state.metadata or {})[:8],  # json_safe: bounded, unlike `metadata`
        [i.source for i in cfg.policy.openpi.inputs],
    )
    return OpenpiPeer(link, acts)


async def reconnect_openpi(peer: OpenpiPeer, cfg: Config, health: LinkHealth) -> bool:
    """One reconnect attempt (the link's own attempt, bounded by the config's connect
    timeout, 1 s at least); True when connected, else the failure told to `health`."""
    try:
        await peer.link.connect(deadline_s=max(1.0, cfg.policy.openpi.connect_timeout_s))
    except ConnectionLost as exc:
        health.failed(exc.message)
        return False
    return True
