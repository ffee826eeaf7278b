"""Bringing the policy link up: hello, the contract in force, the act link and uploads."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from robotd.config import Config
from robotd.contract import Actions, Observations
from robotd.link.client import Handshake, PolicyClient, PolicyError
from robotd.link.session import ActLink, FrameSource, LinkCounters, StepRing, choose_contract
from robotd.link.uplink import Uplink, make_uplink
from robotd.link.windows import WindowPlanner
from robotd.shm import FrameRing

log = logging.getLogger("robotd.link")

HELLO_DEADLINE_S = 30.0


class StartupError(RuntimeError):
    """The daemon could not bring its lanes up; the message says which and why."""


@dataclass
class PolicyLink:
    client: PolicyClient
    handshake: Handshake
    link: ActLink
    uplink: Uplink | None
    actions: Actions | None


async def hello(
    cfg: Config, endpoint: str, worker_failed: Callable[[], str]
) -> tuple[PolicyClient, Handshake]:
    """Say hello until the worker answers; StartupError when it died or never answers."""
    # Short hellos while the worker comes up, so a dead one is noticed quickly.
    client = PolicyClient(endpoint, timeout_s=1.0)
    deadline = time.monotonic() + HELLO_DEADLINE_S
    while True:
        try:
            handshake = await client.connect(observe=True)
            client.timeout_s = cfg.policy.timeout_s
            return client, handshake
        except (TimeoutError, PolicyError) as exc:
            failed = worker_failed()
            if failed:
                await client.close()
                raise StartupError(f"{failed} (policy {cfg.policy.serve})") from None
            if time.monotonic() > deadline:
                await client.close()
                raise StartupError(
                    f"policy worker at {endpoint} did not answer hello: {exc}"
                ) from None
            await anyio.sleep(0.2)


def contract_in_force(cfg: Config, hs: Handshake) -> tuple[Observations | None, Actions | None]:
    """The worker's declared contract, else the config's (servers that cannot declare)."""
    p = cfg.policy
    configured_obs = (
        Observations.from_wire(p.observations, "policy.observations")
        if p.observations is not None
        else None
    )
    configured_act = (
        Actions.from_wire(p.actions, "policy.actions") if p.actions is not None else None
    )
    obs = choose_contract(hs.observations, configured_obs)
    return obs, hs.actions if hs.actions is not None else configured_act


async def connect_policy(
    cfg: Config,
    endpoint: str,
    *,
    steps: StepRing,
    rings: dict[str, FrameRing],
    send_down: Callable[[dict[str, Any]], None],
    worker_failed: Callable[[], str],
) -> PolicyLink:
    """Hello, then the window planner, the uploads (when the worker has an observe
    endpoint) and the act link, sized to the contract in force."""
    client, hs = await hello(cfg, endpoint, worker_failed)
    obs, actions = contract_in_force(cfg, hs)
    resolved = obs.resolve(cfg.control.hz) if obs is not None else None
    planner = WindowPlanner(resolved, cfg.observation_keys)
    steps.keep = planner.lookback + 2 * int(cfg.control.hz) + 16
    counters = LinkCounters()
    uplink = make_uplink(cfg, hs, endpoint, obs, planner, actions, steps, rings, counters)
    link = ActLink(
        client,
        planner,
        steps,
        FrameSource(rings),
        send_down,
        control_hz=cfg.control.hz,
        actions=actions,
        camera_names=set(cfg.cameras),
        uplink=uplink,
        stream_wait_s=cfg.policy.stream_wait_s,
        counters=counters,
    )
    log.info(
        "policy %s at %s: streams %s",
        hs.policy,
        endpoint,
        sorted(resolved.keys) if resolved else "undeclared (the act's own step)",
    )
    return PolicyLink(client, hs, link, uplink, actions)
