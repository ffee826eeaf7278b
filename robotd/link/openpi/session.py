"""The openpi side of a policy session: connect to the server, build the act path, and
rebuild it after a loss (each new connection is a new server-side session, so the episode
was reset when the old one was lost). After each connect the link's warm-up inference runs
in a task of its own (robotd.link.openpi.warmup); acts wait for it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from robotd.config import Config
from robotd.link.connect import StartupError
from robotd.link.health import LinkHealth
from robotd.link.openpi.acts import OpenpiActs
from robotd.link.openpi.client import OpenpiLink
from robotd.link.openpi.errors import ConnectionLost, RequestError
from robotd.link.rtc import RtcRefused
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
    """The link, its act path, and where the link's warm-up runs after each connect."""

    link: OpenpiLink
    acts: OpenpiActs
    start_soon: Callable[[Callable[[], Awaitable[None]]], None]

    def warm_up(self) -> None:
        """Run the warm-up the connect just made armed (a no-op when none is)."""
        self.start_soon(self.link.warm_up)


async def connect_openpi(
    session: Session,
    start_soon: Callable[[Callable[[], Awaitable[None]]], None],
    *,
    deadline_s: float = CONNECT_DEADLINE_S,
    source: str = "policy.worker",
) -> OpenpiPeer:
    """The first connection to the openpi server, its warm-up started with `start_soon`
    (the session's task group's); StartupError when there is none within `deadline_s` (or
    the endpoint or key is unusable), naming `source` (where the endpoint came from)."""
    cfg = session.cfg
    try:
        link = OpenpiLink(session.endpoint, cfg.policy.openpi)
    except ValueError as exc:
        raise StartupError(f"{source} {session.endpoint!r}: {exc}") from None
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
    if cfg.policy.openpi.warmup_s > 0:
        try:
            link.warmup_request = acts.warmup_request()
        except (RequestError, RtcRefused) as exc:  # config checks make this unlikely
            log.warning("openpi warm-up off: its request cannot be built: %s", exc)
    try:
        await link.connect(deadline_s=deadline_s)
    except ConnectionLost as exc:
        await link.close()
        raise StartupError(f"openpi server ({source}): {exc.message}") from None
    peer = OpenpiPeer(link, acts, start_soon)
    peer.warm_up()
    session.steps.keep = acts.planner.lookback + 2 * int(cfg.control.hz) + 16
    log.info(
        "openpi server at %s (metadata: %s): inputs %s",
        session.endpoint,
        list(link.state.metadata or {})[:8],  # json_safe: bounded, unlike `metadata`
        [i.source for i in cfg.policy.openpi.inputs],
    )
    return peer


async def reconnect_openpi(peer: OpenpiPeer, cfg: Config, health: LinkHealth) -> bool:
    """One reconnect attempt (the link's own attempt, bounded by the config's connect
    timeout, 1 s at least); True when connected (its warm-up started: a restarted server
    compiles again), else the failure told to `health`."""
    try:
        await peer.link.connect(deadline_s=max(1.0, cfg.policy.openpi.connect_timeout_s))
    except ConnectionLost as exc:
        health.failed(exc.message)
        return False
    peer.warm_up()
    return True
