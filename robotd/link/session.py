"""The policy session: the main process's owner of the policy link, and of what its health
means to the control lane.

It brings the link up (robotd.link.connect for robotd's own workers, robotd.link.openpi
for openpi servers), keeps the step ring the windows are read from, answers the control
lane's asks (each act a task of its own), feeds the uplink, ends worker-side episodes, and
answers operators (the policy's params, the link's state and counts).

Its health is robotd.link.watch's: heartbeats, a lost episode or a gone worker told to the
lane once, reconnect attempts. When the worker is gone the session drops its link — act
and observe connections both — and builds it again once the worker answers; asks
meanwhile fail at once, saying why.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio
import anyio.abc
import msgspec

from robotd.config import Config
from robotd.contract import Actions, ContractError
from robotd.lane.messages import ActFailed, Ask, Contract, Merged, Status, Step
from robotd.link.client import Handshake, PolicyClient, PolicyError
from robotd.link.connect import HELLO_DEADLINE_S, PolicyLink, StartupError, build_link, hello
from robotd.link.dropped import DROPPED_KINDS
from robotd.link.frame_tap import FrameTap
from robotd.link.health import LinkHealth
from robotd.link.steps import LinkCounters, StepRing
from robotd.link.uplink import UplinkTap
from robotd.link.watch import LinkEvents, LinkWatch
from robotd.shm import FrameRing

log = logging.getLogger("robotd.link")


class LinkTap(UplinkTap, FrameTap, LinkEvents, Protocol):
    """Told what the link does (the trace: robotd.runtime.recorder): what went up (uploaded
    or inline), what the worker refused, and the link's own events. Returns at once."""


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
        self.steps = StepRing(keep=256)
        self.counters = LinkCounters()
        self.health = LinkHealth(cfg.policy.reconnect_max_s)
        self.link: PolicyLink | None = None  # robotd's own worker
        self.openpi: Any = None  # an openpi server's link and acts (robotd.link.openpi)
        self._tg: anyio.abc.TaskGroup | None = None
        self._uplink_scope: anyio.CancelScope | None = None
        self._wep = ""  # the worker-side episode the lane runs now
        self._contract = Contract()
        self._handshake: Handshake | None = None
        self.closing = False  # the daemon stops: the watch ends, acts cut short are no errors
        self._replies_before: Counter[str] = Counter()  # dropped by clients gone, by kind
        self.trace: LinkTap | None = None  # set before connect: every uplink is tapped
        self.watch = LinkWatch(self)  # its health

    @property
    def handshake(self) -> Handshake | None:
        return self._handshake

    @property
    def wep(self) -> str:
        """The worker-side episode the lane runs now ("" before the first)."""
        return self._wep

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

            self.openpi = await connect_openpi(
                self, tg.start_soon, deadline_s=wait_s, source=source
            )
            self.openpi.acts.tap = self.trace
            actions = self.openpi.acts.actions
        else:
            link = await self._first_link(wait_s, source)
            self._install(link)
            actions = link.actions
        self.health.up()
        self._contract = self._contract_for(actions)
        tg.start_soon(self.watch.run)
        if self.not_ready():  # the lane is told again, ready, by `answering`'s caller
            return msgspec.structs.replace(self._contract, ready=False)
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
            return self._build(client, hs)
        except (StartupError, ContractError):
            await client.close()
            raise

    def _build(self, client: PolicyClient, hs: Handshake) -> PolicyLink:
        """The link over `client` to the worker that said `hs`; StartupError or
        ContractError when its contract cannot be used (the client is the caller's)."""
        return build_link(
            self.cfg, self.endpoint, client, hs, self.steps, self.rings, self.send_down,
            self.counters, self.episode_lost, self.task,
        )  # fmt: skip

    def relink(self, client: PolicyClient, hs: Handshake) -> None:
        """The worker back (it answered hello again): its link installed and the session
        up; the lane told the new contract if it changed. StartupError or ContractError
        (nothing installed) when its contract cannot be used."""
        link = self._build(client, hs)
        self._install(link)
        self.watch.back()
        contract = self._contract_for(link.actions)
        if contract != self._contract:
            self._contract = contract
            self.send_down(contract)

    def not_ready(self) -> str:
        """Why acts wait now though the link is up, in words ("" when they do not): an
        openpi server's warm-up inference holds them (its first, which compiles)."""
        if self.openpi is None or not self.openpi.link.warmup.holding:
            return ""
        words = self.openpi.link.warmup.words()  # holding: "running for ..."
        return f"the openpi server's warm-up inference (its first, which compiles) is {words}"

    async def answering(self) -> Contract:
        """Once acts no longer wait (`not_ready` is ""; a warm-up is bounded by its
        warmup_s): the contract in force, ready."""
        if self.openpi is not None:
            await self.openpi.link.warmup.wait()
        return self._contract

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

    # ---- health (robotd.link.watch) ---------------------------------------------------------

    def worker_gone(self, reason: str) -> None:
        """The worker is gone or unusable: the lane resets its episode, the robot holds, the
        link is dropped (the watch builds it again)."""
        if not self.watch.gone(reason):
            return
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
        self.watch.episode_lost(wep, cause)

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
            if warmup := self.openpi.link.warmup.words():  # the openpi server's first infer
                out["warmup"] = warmup
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
        self.closing = True
        if self.link is not None:
            self.link.link.stopping = True
            await self.link.client.close()
        if self.openpi is not None:
            self.openpi.acts.stopping = True
            await self.openpi.link.close()
