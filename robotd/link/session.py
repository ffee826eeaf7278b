"""The policy session: the main process's owner of the policy link.

It brings the link up (robotd.link.connect), keeps the step ring the windows are read
from, answers the control lane's asks (each act a task of its own), feeds the uplink
from the steps and merge reports, and ends worker-side episodes. The daemon hands it the
lane's messages; it hands chunks and failures back through `send_down`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from robotd.config import Config
from robotd.lane.messages import ActFailed, Ask, Contract, Merged, Step
from robotd.link.client import Handshake, PolicyError
from robotd.link.connect import PolicyLink, connect_policy
from robotd.link.steps import LinkCounters, StepRing
from robotd.shm import FrameRing

log = logging.getLogger("robotd.link")


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
    ) -> None:
        self.cfg = cfg
        self.endpoint = endpoint
        self.rings = rings
        self.send_down = send_down
        self.worker_failed = worker_failed
        self.steps = StepRing(keep=256)
        self.link: PolicyLink | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def handshake(self) -> Handshake | None:
        return self.link.handshake if self.link is not None else None

    @property
    def counters(self) -> LinkCounters | None:
        return self.link.link.counters if self.link is not None else None

    async def connect(self, tg: anyio.abc.TaskGroup) -> Contract:
        """Hello, the contract in force, the act link and the uploads (a task in `tg`);
        returns the Contract message for the control lane. StartupError or ContractError
        when the worker cannot be used."""
        self.link = await connect_policy(
            self.cfg,
            self.endpoint,
            steps=self.steps,
            rings=self.rings,
            send_down=self.send_down,
            worker_failed=self.worker_failed,
        )
        self._tg = tg
        if self.link.uplink is not None:
            tg.start_soon(self.link.uplink.run)
        actions = self.link.actions
        return Contract(actions.open_loop_horizon if actions is not None else None)

    # ---- the lane's messages ------------------------------------------------------------

    def on_step(self, rec: Step) -> None:
        self.steps.add(rec)
        if self.link is not None and self.link.uplink is not None:
            self.link.uplink.on_step(rec)

    def on_ask(self, ask: Ask) -> None:
        """Planned here, in message order (the steps before it are known, the ones after it
        are not yet); the act itself runs in a task of its own."""
        if self.link is None or self._tg is None:
            self.send_down(ActFailed(ask.id, "no policy link"))
            return
        act = self.link.link.begin(ask)
        if act is not None:
            self._tg.start_soon(self.link.link.finish, act)

    def on_merged(self, msg: Merged) -> None:
        if self.link is not None and self.link.uplink is not None:
            self.link.uplink.on_chunk(msg)

    def on_episode_end(self, wep: str) -> None:
        if self.link is not None and self._tg is not None:
            self._tg.start_soon(self._end_worker_episode, wep)

    async def _end_worker_episode(self, wep: str) -> None:
        assert self.link is not None
        self.link.link.forget(wep)
        try:
            await self.link.client.end_episode(wep)
        except (PolicyError, TimeoutError) as exc:
            log.warning("end_episode %s: %s", wep, exc)

    async def close(self) -> None:
        if self.link is not None:
            await self.link.client.close()
