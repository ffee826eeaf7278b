"""Bringing the policy link up: hello, the contract in force, the act link and uploads."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import anyio

from robotd.config import Config
from robotd.contract import Actions, Observations
from robotd.link.act import ActLink
from robotd.link.chunks import ChunkLimits, ChunkRefused
from robotd.link.client import Handshake, PolicyClient, PolicyError, observe_address
from robotd.link.observe import UplinkLimits
from robotd.link.steps import LinkCounters, RingFrames, StepReader, StepRing
from robotd.link.uplink import Uplink
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
            if isinstance(exc, PolicyError) and exc.code == "bad_reply":
                # A worker that answers, wrongly, will not answer better on a retry.
                await client.close()
                raise StartupError(f"policy worker at {endpoint}: {exc}") from None
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


def choose_contract(
    worker: Observations | None, configured: Observations | None
) -> Observations | None:
    """The worker's declared contract wins; the config's serves servers that cannot declare."""
    if worker is not None and configured is not None:
        from robotd.contract import differences

        diff = differences(configured, worker)
        if diff:
            log.warning(
                "the config's observation contract differs from the worker's (the worker's "
                "is used): %s",
                "; ".join(diff),
            )
    return worker if worker is not None else configured


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
    send_down: Callable[[Any], None],
    worker_failed: Callable[[], str],
) -> PolicyLink:
    """Hello, then the window planner, the uploads (when the worker has an observe
    endpoint) and the act link, sized to the contract in force."""
    client, hs = await hello(cfg, endpoint, worker_failed)
    obs, actions = contract_in_force(cfg, hs)
    limits = ChunkLimits(max_rows=cfg.policy.max_chunk_rows, dim=len(cfg.joints.names))
    try:
        limits.check_hz(actions.hz if actions is not None else None, cfg.control.hz)
    except ChunkRefused as exc:
        await client.close()
        raise StartupError(f"policy worker at {endpoint}: {exc}") from None
    resolved = obs.resolve(cfg.control.hz) if obs is not None else None
    planner = WindowPlanner(resolved, cfg.observation_keys)
    steps.keep = planner.lookback + 2 * int(cfg.control.hz) + 16
    counters = LinkCounters()
    reader = StepReader(steps, RingFrames(rings))
    uplink = make_uplink(cfg, hs, endpoint, obs, planner, actions, reader, counters)
    link = ActLink(
        client,
        planner,
        reader,
        send_down,
        control_hz=cfg.control.hz,
        actions=actions,
        limits=limits,
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


def make_uplink(
    cfg: Config,
    hello: Handshake,
    act_endpoint: str,
    obs: Observations | None,
    planner: WindowPlanner,
    actions: Actions | None,
    reader: StepReader,
    counters: LinkCounters,
) -> Uplink | None:
    """The daemon's uplink to the worker that said `hello`, or None if it offers no observe
    endpoint (then acts carry their windows). Warns when a camera ring holds less than the
    contract looks back (such frames would be declared lost)."""
    observe = hello.endpoints.get("observe")
    if not observe:
        log.info("the worker offers no observe endpoint: windows go inline in each act")
        return None
    c, p = cfg.control, cfg.policy
    back_s = planner.lookback / c.hz
    for name, cam in cfg.cameras.items():
        if name in planner.keys and back_s + 0.5 > cam.ring_seconds:
            log.warning(
                "cameras.%s.ring_seconds = %g but the contract looks %.2f s back: frames "
                "older than the ring are declared lost; raise ring_seconds",
                name,
                cam.ring_seconds,
                back_s,
            )
    limits = UplinkLimits(p.max_episode_frames, p.max_episode_bytes).within(hello.limits)
    olh = actions.open_loop_horizon if actions is not None else None
    warn_window_over_limit(planner, set(cfg.cameras), olh or 1, limits, p.max_episode_frames)
    streams = obs.streams if obs is not None else {}
    return Uplink(
        observe_address(observe, act_endpoint),
        planner,
        reader,
        {k: s.camera for k, s in streams.items() if k in cfg.cameras},
        counters,
        timing=c.timing,
        open_loop_horizon=olh,
        refill_steps=c.refill_steps,
        merge=c.merge,
        limits=limits,
        when_behind=obs.when_behind if obs is not None else "wait",
    )


def window_frames(planner: WindowPlanner, cameras: Collection[str], interval: int) -> int:
    """Camera frames one act reads once an episode is under way (acts `interval` apart)."""
    t = planner.lookback + interval
    return sum(len(keys & set(cameras)) for keys in planner.needed(t, t - interval).values())


def warn_window_over_limit(
    planner: WindowPlanner,
    cameras: Collection[str],
    interval: int,
    limits: UplinkLimits,
    configured: int,
) -> bool:
    """Warn (True) when one act's window holds more camera frames than the worker may keep
    for an episode: uploads cannot run ahead of such acts."""
    frames = window_frames(planner, cameras, interval)
    if frames <= limits.episode_frames:
        return False
    log.warning(
        "one act's window reads %d camera frames (%d look-back steps, cameras %s) but the "
        "worker may hold only %d frames per episode (policy.max_episode_frames = %d%s): "
        "frames cannot go up ahead of the acts; each act's go up when it is asked and what "
        "the worker cannot keep is sent inline. Raise policy.max_episode_frames and the "
        "worker's --max-episode-frames to at least %d (two windows: the next one goes up "
        "while an act holds its own)",
        frames,
        planner.lookback,
        sorted(set(cameras) & set(planner.keys)),
        limits.episode_frames,
        configured,
        ", lowered to the worker's limit" if limits.episode_frames < configured else "",
        2 * frames,
    )
    return True
