"""The policy link's health, for the policy session (robotd.link.session, which owns the
link, builds it and drops it): noticed (heartbeats while the worker is up), said (logged,
traced, and told to the control lane once per episode) and mended (reconnect attempts with
capped exponential backoff while it is gone).

A heartbeat is a ping every PING_EVERY_S that asks about the running episode too, so a
lost copy of the policy is noticed even when no act is in flight (a ping costs either side
~0.1 ms). Each ping waits PING_WAIT_S at most; the worker is gone when nothing came from it
for policy.heartbeat_s, or when another worker process answers than the one that said
hello (it restarted behind the connection). An older worker without pings is said hello
to instead. An openpi server's connection is watched by its own link (the websocket's
keepalive): here only whether it is still up.

The lane is told a running episode is lost (`EpisodeLost`: a new worker-side episode, the
queue flushed, the robot holding) once per episode, whether the worker's copy of the policy
lost it (an `episode_lost` reply, or a heartbeat saying so) or the worker itself is gone;
the worker back is said in words of what the lane does then (robotd.link.health).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio

from robotd.config import Config
from robotd.contract import ContractError
from robotd.lane.messages import EpisodeLost, Status
from robotd.link.client import Handshake, PolicyClient, PolicyError
from robotd.link.connect import PolicyLink, StartupError, hello_once
from robotd.link.health import LinkHealth, back_words
from robotd.link.replies import ping_episode, ping_instance
from robotd.link.steps import LinkCounters

log = logging.getLogger("robotd.link")

PING_EVERY_S = 0.02
PING_WAIT_S = 1.0  # the most one ping waits for its answer (the heartbeat may be longer)


class LinkEvents(Protocol):
    """Told the link's own events (the trace: robotd.runtime.recorder). Returns at once."""

    def link(self, kind: str, detail: Mapping[str, Any] | None = None, **more: Any) -> None:
        """A link event of `kind` (reconnect: the worker gone, then back)."""
        ...


class Watched(Protocol):
    """What of the policy session (robotd.link.session) the watch uses."""

    cfg: Config
    endpoint: str
    health: LinkHealth
    counters: LinkCounters
    link: PolicyLink | None  # robotd's own worker's link, None while gone
    openpi: Any  # an openpi server's link and acts (robotd.link.openpi.session.OpenpiPeer)
    closing: bool  # the daemon stops: the watch ends
    send_down: Callable[[Any], None]  # to the control lane
    lane_status: Callable[[], Status | None]  # the lane's latest state

    @property
    def trace(self) -> LinkEvents | None: ...

    @property
    def wep(self) -> str:
        """The worker-side episode the lane runs now ("" before the first)."""
        ...

    def worker_gone(self, reason: str) -> None:
        """The worker is gone or unusable: said so (`LinkWatch.gone`), its link dropped."""
        ...

    def relink(self, client: PolicyClient, handshake: Handshake) -> None:
        """The worker answered hello again: its link built and installed (then `back`);
        StartupError or ContractError when its contract cannot be used."""
        ...


class LinkWatch:
    """One session's link watched until the session closes (see the module docstring)."""

    def __init__(self, session: Watched) -> None:
        self.session = session
        self._gone_episode = 0  # the operator episode running when the worker went (0: none)
        self._lost: deque[str] = deque(maxlen=64)  # episodes already reported lost

    async def run(self) -> None:
        """Heartbeats while up; reconnect attempts (with backoff) while gone."""
        s = self.session
        hb = s.cfg.policy.heartbeat_s
        while not s.closing:
            if not s.health.is_up:
                await self._reconnect()
                continue
            await anyio.sleep(min(hb / 4, PING_EVERY_S))
            if s.openpi is not None:
                if not s.openpi.link.connected:
                    s.worker_gone(f"openpi connection lost ({s.openpi.link.state.last_error})")
                continue
            if s.link is not None:
                await self._heartbeat(s.link, hb)

    async def _heartbeat(self, link: PolicyLink, hb: float) -> None:
        """One ping. The worker is gone when nothing came from it for `hb`; a ping waits at
        most PING_WAIT_S, so one lost on the way (its connection dropped, a restarted worker
        behind it) costs that wait and not the whole heartbeat: the next ping asks whoever
        answers now."""
        s = self.session
        client = link.client
        try:
            if "ping" in link.handshake.features:
                asked = s.wep  # the reply may come after the lane moved on to a new one
                got = await client.ping(asked or None, timeout_s=min(hb, PING_WAIT_S))
                if self._restarted(link, ping_instance(got)):
                    return
                said = ping_episode(got)
                if said is not None and said[0] == "lost":
                    s.episode_lost(asked, said[1] or "lost")
            else:  # an older worker: hello is its ping
                self._restarted(link, (await link.client.connect(observe=True)).instance)
        except TimeoutError:
            if time.monotonic() - client.last_heard >= hb:
                s.worker_gone(f"no heartbeat answered within {hb:g} s")
        except PolicyError as exc:
            if exc.code not in ("closed", "connection_lost"):
                s.worker_gone(f"heartbeat refused: {exc}")

    def _restarted(self, link: PolicyLink, instance: str | None) -> bool:
        """A heartbeat answered by another worker process than the one that said hello
        (restarted within the heartbeat, its connection back before it was missed): it
        holds none of our episode, and its contract may differ, so it is a worker gone and
        back — hello again, its contract checked, a new worker-side episode."""
        was = link.handshake.instance
        if not was or not instance or instance == was:
            return False
        self.session.worker_gone(
            f"the worker restarted (another process answers: {instance}, was {was})"
        )
        return True

    async def _reconnect(self) -> None:
        """One attempt, after the backoff's delay: hello (or the openpi server's own
        connect), then the link rebuilt; a failure is the health's to count and say."""
        s = self.session
        await anyio.sleep(s.health.retry_delay())
        if s.openpi is not None:
            from robotd.link.openpi.session import reconnect_openpi

            if await reconnect_openpi(s.openpi, s.cfg, s.health):
                self.back()
            return
        try:
            client, hs = await hello_once(s.cfg, s.endpoint, s.cfg.policy.heartbeat_s)
        except (TimeoutError, PolicyError) as exc:
            s.health.failed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            return
        try:
            s.relink(client, hs)
        except (StartupError, ContractError) as exc:
            await client.close()
            s.health.failed(f"its contract cannot be used: {exc}", answers=True)

    # ---- what a loss and a return are said as --------------------------------------------------

    def gone(self, reason: str) -> bool:
        """The worker gone or unusable: logged, traced, and the lane told its episode is
        lost; True when the link was up until now (the session drops it then)."""
        s = self.session
        if s.closing or not s.health.gone(reason):
            return False
        log.warning("policy worker gone: %s; the robot holds, reconnecting", reason)
        st = s.lane_status()
        self._gone_episode = st.episode if st is not None and st.state == "RUNNING" else 0
        if s.trace is not None:
            s.trace.link("reconnect", state="gone", reason=reason[:500])
        self._report_lost(f"worker gone: {reason}")
        return True

    def episode_lost(self, wep: str, cause: str) -> None:
        """The worker's copy holding `wep` is gone (the worker itself is fine)."""
        if wep == self.session.wep and self._report_lost(cause):
            log.warning("the policy lost episode %s: %s", wep, cause)

    def _report_lost(self, cause: str) -> bool:
        """Tell the lane the running episode is lost, once an episode: True when told now.
        (Every heartbeat asks about it again, and the act that failed says so too; the lane
        may not move on at once, e.g. when the episode ended meanwhile.)"""
        wep = self.session.wep
        if not wep or wep in self._lost:
            return False
        self._lost.append(wep)
        self.session.send_down(EpisodeLost(cause[:500]))
        return True

    def back(self) -> None:
        """The worker (or openpi server) is back: counted, traced, and said in words of what
        the lane does now."""
        s = self.session
        away = s.health.up()
        s.counters.reconnects = s.health.reconnects
        if s.trace is not None:
            s.trace.link("reconnect", state="back", away_s=round(away, 3))
        gone_ep, self._gone_episode = self._gone_episode, 0
        words = back_words(s.lane_status(), gone_ep)
        log.warning("policy worker back after %.1f s: %s", away, words)
