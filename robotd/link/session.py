"""The policy session: the main process's owner of the policy link, and of its health.

It brings the link up (robotd.link.connect for robotd's own workers, robotd.link.openpi
for openpi servers), keeps the step ring the windows are read from, answers the control
lane's asks (each act a task of its own), feeds the uplink, and ends worker-side episodes.

When the worker's copy of the policy holding the episode is lost (an `episode_lost`
reply, or a heartbeat saying so) the lane is told (`EpisodeLost`: a new worker-side
episode, the queue flushed, the robot holding) once per episode. When the worker itself is
gone (no heartbeat within policy.heartbeat_s, its process exited, the openpi connection
lost) the same, and the link is rebuilt — act and observe connections both — with capped
exponential backoff; asks meanwhile fail at once, saying why. Every change is logged once.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio
import anyio.abc

from robotd.config import Config
from robotd.contract import Actions, ContractError
from robotd.lane.messages import ActFailed, Ask, Contract, EpisodeLost, Merged, Status, Step
from robotd.link.client import DROPPED_KINDS, Handshake, PolicyError
from robotd.link.connect import (
    HELLO_DEADLINE_S,
    PolicyLink,
    StartupError,
    build_link,
    hello,
    hello_once,
)
from robotd.link.frame_tap import FrameTap
from robotd.link.health import LinkHealth, back_words
from robotd.link.replies import ping_episode, ping_instance
from robotd.link.steps import LinkCounters, StepRing
from robotd.link.uplink import UplinkTap
from robotd.shm import FrameRing

log = logging.getLogger("robotd.link")

PING_EVERY_S = 0.02
PING_WAIT_S = 1.0  # the most one ping waits for its answer (the heartbeat may be longer)


class LinkTap(UplinkTap, FrameTap, Protocol):
    """Told what the link does (the trace: robotd.runtime.recorder): what went up (uploaded
    or inline), what the worker refused, and the link's own events. Returns at once."""

    def link(self, kind: str, detail: Mapping[str, Any] | None = None, **more: Any) -> None:
        """A link event of `kind` (reconnect: the worker gone, then back)."""
        ...


class PolicySession:
    """One daemon's link to one policy worker (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        endpoint: str,
        *,
        rings: Mapping[str, FrameRing],
        send_down: Callable[[Any], None],
        worker_failed: Callable[[], str],
        task: Callable[[], str] = lambda: "",
        lane_status: Callable[[], Status | None] = lambda: None,
    ) -> None:
        """`lane_status`: the control lane's latest state (what a worker back acts on)."""
        self.cfg = cfg
        self.endpoint = endpoint
        self.rings = rings
        self.send_down = send_down
        self.worker_failed = worker_failed
        self.task = task
        self.lane_status = lane_status
        self.hello_answered = False  # the first worker answered its hello (rightly)
        self._gone_episode = 0  # the operator episode running when the worker went (0: none)
        self.steps = StepRing(keep=256)
        self.counters = LinkCounters()
        self.health = LinkHealth(cfg.policy.reconnect_max_s)
        self.link: PolicyLink | None = None  # robotd's own worker
        self.openpi: Any = None  # an openpi server's link and acts (robotd.link.openpi)
        self._tg: anyio.abc.TaskGroup | None = None
        self._uplink_scope: anyio.CancelScope | None = None
        self._wep = ""  # the worker-side episode the lane runs now
        self._lost: deque[str] = deque(maxlen=64)  # episodes already reported lost
        self._contract = Contract()
        self._handshake: Handshake | None = None
        self._closing = False
        self._replies_before: Counter[str] = Counter()  # dropped by clients gone, by kind
        self.trace: LinkTap | None = None  # set before connect: every uplink is tapped

    @property
    def handshake(self) -> Handshake | None:
        return self._handshake

    @property
    def served(self) -> bool:
        """Whether a worker ever answered (before that a local worker's exit is fatal)."""
        return self._handshake is not None or self.openpi is not None

    # ---- bringing it up ----------------------------------------------------------------------

    async def connect(
        self,
        tg: anyio.abc.TaskGroup,
        *,
        wait_s: float = HELLO_DEADLINE_S,
        source: str = "policy.worker",
    ) -> Contract:
        """The first connection, waited for `wait_s` at most (StartupError naming `source`,
        where the endpoint came from, or ContractError when the worker cannot be used:
        final); then the link is watched and rebuilt in `tg`. Returns the Contract message
        for the control lane."""
        self._tg = tg
        if self.cfg.policy.link == "openpi":
            from robotd.link.openpi.session import connect_openpi

            self.openpi = await connect_openpi(self, deadline_s=wait_s, source=source)
            self.openpi.acts.tap = self.trace
            actions = self.openpi.acts.actions
        else:
            link = await self._first_link(wait_s, source)
            self._install(link)
            actions = link.actions
        self.health.up()
        self._contract = self._contract_for(actions)
        tg.start_soon(self._watch)
        return self._contract

    async def _first_link(self, wait_s: float, source: str) -> PolicyLink:
        """Hello (retried while the worker comes up), then the link; `hello_answered` says
        which of the two a StartupError came from: a worker that answered and whose
        contract is refused is serving, not still loading."""
        client, hs = await hello(
            self.cfg, self.endpoint, self.worker_failed, wait_s=wait_s, source=source
        )
        self.hello_answered = True
        try:
            return build_link(
                self.cfg, self.endpoint, client, hs, self.steps, self.rings, self.send_down,
                self.counters, self.episode_lost, self.task,
            )
        except (StartupError, ContractError):
            await client.close()
            raise

    def _contract_for(self, actions: Actions | None) -> Contract:
        """The lane's Contract: the horizon, and whether the policy takes the frozen prefix
        (declared by the worker, or for an openpi server by [policy.openpi.rtc])."""
        rtc = actions is not None and actions.rtc is True
        if self.cfg.policy.link == "openpi":
            rtc = rtc or self.cfg.policy.openpi.rtc is not None
        return Contract(actions.open_loop_horizon if actions is not None else None, rtc=rtc)

    def _install(self, link: PolicyLink) -> None:
        self.link, self._handshake = link, link.handshake
        link.link.tap = self.trace
        if link.uplink is not None:
            link.uplink.tap = self.trace
            assert self._tg is not None
            self._tg.start_soon(self._run_uplink, link)

    async def _run_uplink(self, link: PolicyLink) -> None:
        assert link.uplink is not None
        with anyio.CancelScope() as scope:
            self._uplink_scope = scope
            await link.uplink.run()

    # ---- health ------------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Heartbeats while up; reconnect attempts (with backoff) while gone. A heartbeat
        asks about the running episode too, so a lost copy of the policy is noticed within
        PING_EVERY_S even when no act is in flight (a ping costs either side ~0.1 ms)."""
        hb = self.cfg.policy.heartbeat_s
        while not self._closing:
            if not self.health.is_up:
                await self._reconnect()
                continue
            await anyio.sleep(min(hb / 4, PING_EVERY_S))
            if self.openpi is not None:
                if not self.openpi.link.connected:
                    self.worker_gone(
                        f"openpi connection lost ({self.openpi.link.state.last_error})"
                    )
                continue
            if self.link is not None:
                await self._heartbeat(self.link, hb)

    async def _heartbeat(self, link: PolicyLink, hb: float) -> None:
        """One ping. The worker is gone when nothing came from it for `hb`; a ping waits at
        most PING_WAIT_S, so one lost on the way (its connection dropped, a restarted worker
        behind it) costs that wait and not the whole heartbeat: the next ping asks whoever
        answers now."""
        client = link.client
        try:
            if "ping" in link.handshake.features:
                asked = self._wep  # the reply may come after the lane moved on to a new one
                got = await client.ping(asked or None, timeout_s=min(hb, PING_WAIT_S))
                if self._restarted(link, ping_instance(got)):
                    return
                said = ping_episode(got)
                if said is not None and said[0] == "lost":
                    self.episode_lost(asked, said[1] or "lost")
            else:  # an older worker: hello is its ping
                self._restarted(link, (await link.client.connect(observe=True)).instance)
        except TimeoutError:
            if time.monotonic() - client.last_heard >= hb:
                self.worker_gone(f"no heartbeat answered within {hb:g} s")
        except PolicyError as exc:
            if exc.code not in ("closed", "connection_lost"):
                self.worker_gone(f"heartbeat refused: {exc}")

    def _restarted(self, link: PolicyLink, instance: str | None) -> bool:
        """A heartbeat answered by another worker process than the one that said hello
        (restarted within the heartbeat, its connection back before it was missed): it
        holds none of our episode, and its contract may differ, so it is a worker gone and
        back — hello again, its contract checked, a new worker-side episode."""
        was = link.handshake.instance
        if not was or not instance or instance == was:
            return False
        self.worker_gone(f"the worker restarted (another process answers: {instance}, was {was})")
        return True

    def worker_gone(self, reason: str) -> None:
        """The worker is gone or unusable: the lane resets its episode, the robot holds, the
        link is rebuilt."""
        if self._closing or not self.health.gone(reason):
            return
        log.warning("policy worker gone: %s; the robot holds, reconnecting", reason)
        st = self.lane_status()
        self._gone_episode = st.episode if st is not None and st.state == "RUNNING" else 0
        if self.trace is not None:
            self.trace.link("reconnect", state="gone", reason=reason[:500])
        self._report_lost(f"worker gone: {reason}")
        link, self.link = self.link, None
        if self._uplink_scope is not None:
            self._uplink_scope.cancel()
            self._uplink_scope = None
        if link is not None:
            c = link.client
            self._replies_before.update(c.dropped_replies())
            if self._tg is not None:
                self._tg.start_soon(c.close)

    def episode_lost(self, wep: str, cause: str) -> None:
        """The worker's copy holding `wep` is gone (the worker itself is fine)."""
        if wep == self._wep and self._report_lost(cause):
            log.warning("the policy lost episode %s: %s", wep, cause)

    def _report_lost(self, cause: str) -> bool:
        """Tell the lane the running episode is lost, once an episode: True when told now.
        (Every heartbeat asks about it again, and the act that failed says so too; the lane
        may not move on at once, e.g. when the episode ended meanwhile.)"""
        wep = self._wep
        if not wep or wep in self._lost:
            return False
        self._lost.append(wep)
        self.send_down(EpisodeLost(cause[:500]))
        return True

    async def _reconnect(self) -> None:
        await anyio.sleep(self.health.retry_delay())
        if self.openpi is not None:
            from robotd.link.openpi.session import reconnect_openpi

            if await reconnect_openpi(self):
                self._back()
            return
        try:
            client, hs = await hello_once(self.cfg, self.endpoint, self.cfg.policy.heartbeat_s)
        except (TimeoutError, PolicyError) as exc:
            self.health.failed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            return
        try:
            link = build_link(
                self.cfg,
                self.endpoint,
                client,
                hs,
                self.steps,
                self.rings,
                self.send_down,
                self.counters,
                self.episode_lost,
                self.task,
            )
        except (StartupError, ContractError) as exc:
            await client.close()
            self.health.failed(f"its contract cannot be used: {exc}", answers=True)
            return
        self._install(link)
        self._back()
        contract = self._contract_for(link.actions)
        if contract != self._contract:
            self._contract = contract
            self.send_down(contract)

    def _back(self) -> None:
        away = self.health.up()
        self.counters.reconnects = self.health.reconnects
        if self.trace is not None:
            self.trace.link("reconnect", state="back", away_s=round(away, 3))
        gone_ep, self._gone_episode = self._gone_episode, 0
        words = back_words(self.lane_status(), gone_ep)
        log.warning("policy worker back after %.1f s: %s", away, words)

    # ---- the lane's messages -----------------------------------------------------------------

    def on_step(self, rec: Step) -> None:
        self._wep = rec.wep
        self.steps.add(rec)
        if self.link is not None and self.link.uplink is not None:
            self.link.uplink.on_step(rec)

    def on_ask(self, ask: Ask) -> None:
        """Planned here, in message order (the steps before it are known, the ones after it
        are not yet); the act itself runs in a task of its own."""
        self._wep = ask.wep
        acts = self._acts()
        if acts is None or self._tg is None:
            why = self.health.reason or "no policy link"
            self.send_down(ActFailed(ask.id, f"policy worker gone ({why}); reconnecting"))
            return
        act = acts.begin(ask)
        if act is not None:
            self._tg.start_soon(acts.finish, act)

    def _acts(self) -> Any:
        if not self.health.is_up:
            return None
        if self.openpi is not None:
            return self.openpi.acts
        return self.link.link if self.link is not None else None

    def on_merged(self, msg: Merged) -> None:
        self.health.served()
        if self.link is not None and self.link.uplink is not None:
            self.link.uplink.on_chunk(msg)

    def on_episode_end(self, wep: str) -> None:
        if self.openpi is not None:
            self.openpi.acts.forget(wep)
        elif self.link is not None and self._tg is not None:
            self._tg.start_soon(self._end_worker_episode, self.link, wep)

    async def _end_worker_episode(self, link: PolicyLink, wep: str) -> None:
        link.link.forget(wep)
        try:
            await link.client.end_episode(wep)
        except (PolicyError, TimeoutError) as exc:
            log.warning("end_episode %s: %s", wep, exc)

    # ---- operators ---------------------------------------------------------------------------

    async def params(self, changes: dict[str, Any] | None) -> dict[str, Any]:
        """The policy's inference parameters (set from the next episode on); PolicyError
        when the worker refuses (naming the parameter) or has none to set."""
        link = self.link
        if link is None or not self.health.is_up:
            raise PolicyError("unavailable", f"no policy worker ({self.health.reason})")
        if "params" not in link.handshake.features:
            raise PolicyError("not_supported", f"policy {link.handshake.policy} takes no params")
        return await link.client.params(changes)

    def state(self) -> dict[str, Any]:
        """The link's state for status and telemetry."""
        out = {"link": self.cfg.policy.link, "endpoint": self.endpoint, **self.health.as_dict()}
        if self._handshake is not None:
            out["policy"] = self._handshake.policy
        if self.openpi is not None:
            out["server"] = self.openpi.link.state.as_dict()
        return out

    def reply_counts(self) -> dict[str, int]:
        """Replies dropped over every connection of the session, by kind (DROPPED_KINDS)."""
        counts = Counter(self._replies_before)
        if self.link is not None:
            counts.update(self.link.client.dropped_replies())
        if self.openpi is not None:  # one link over every connection: its counts are whole
            counts.update(self.openpi.link.dropped_replies())
        return {kind: counts[kind] for kind in DROPPED_KINDS}

    async def close(self) -> None:
        """The daemon stops: acts still in flight end unanswered, and are not errors."""
        self._closing = True
        if self.link is not None:
            self.link.link.stopping = True
            await self.link.client.close()
        if self.openpi is not None:
            self.openpi.acts.stopping = True
            await self.openpi.link.close()
