"""Bringing the policy link up: hello, the contract in force, the act link and uploads."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from robotd.config import Config
from robotd.contract import Actions, Observations
from robotd.link.act import ActLink
from robotd.link.chunks import ChunkLimits, ChunkRefused
from robotd.link.client import Handshake, PolicyClient, PolicyError
from robotd.link.peer import diagnose
from robotd.link.posts import UplinkLimits
from robotd.link.steps import LinkCounters, RingFrames, StepReader, StepRing
from robotd.link.uplink import Uplink
from robotd.link.windows import WindowPlanner
from robotd.shm import FrameRing
from robotd.stream.endpoint import port_problem, worker_problem

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


async def hello_once(
    cfg: Config, endpoint: str, timeout_s: float
) -> tuple[PolicyClient, Handshake]:
    """One hello to the worker at `endpoint`; the client (its timeout the config's) and what
    the worker said. TimeoutError when it does not answer (its message says why, as far as
    the transport knows), PolicyError when it refuses or breaks the protocol (code
    "bad_reply"); the client is closed then."""
    client = PolicyClient(endpoint, timeout_s=timeout_s)
    try:
        handshake = await client.connect(observe=True)
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await client.close()
        if isinstance(exc, TimeoutError):
            why = client.connect_error or str(exc) or f"no connection within {timeout_s:g} s"
            raise TimeoutError(why) from None
        raise
    client.timeout_s = cfg.policy.timeout_s
    return client, handshake


async def hello(
    cfg: Config,
    endpoint: str,
    worker_failed: Callable[[], str],
    *,
    wait_s: float = HELLO_DEADLINE_S,
    source: str = "policy.worker",
) -> tuple[PolicyClient, Handshake]:
    """Say hello until the worker answers, `wait_s` at most; StartupError when it died,
    answers wrongly or never answers, naming `source` (where the endpoint came from:
    `policy.worker`, `--worker`, the local worker) and why.

    After the first unanswered hello, what is at the endpoint is looked at once
    (robotd.link.peer.diagnose) and logged: "no answer yet (why)". When the peer says it
    is no worker (a ZeroMQ socket of another type, or one asking for security) that is a
    warning, and the wait still goes on to `wait_s`: the answer is known but may not
    last, since a worker may take the port over (one restarting, its old holder gone);
    the StartupError at the end looks again and says what is there then."""
    deadline = time.monotonic() + wait_s
    where = f"policy worker at {endpoint} ({source})"
    first = True
    while True:
        left = deadline - time.monotonic()
        try:
            # Short hellos while the worker comes up, so a dead one is noticed quickly.
            return await hello_once(cfg, endpoint, max(0.05, min(1.0, left)))
        except (TimeoutError, PolicyError) as exc:
            if isinstance(exc, PolicyError) and exc.code == "bad_reply":
                # A worker that answers, wrongly, will not answer better on a retry.
                raise StartupError(f"{where}: {exc}") from None
            failed = worker_failed()
            if failed:
                raise StartupError(f"{failed} (policy {cfg.policy.serve})") from None
            if time.monotonic() >= deadline:
                told = await diagnose(endpoint, source)
                why = told.text or str(exc) or type(exc).__name__
                raise StartupError(
                    f"{where} did not answer hello within {wait_s:g} s: {why}"
                ) from None
            if first:
                first = False
                told = await diagnose(endpoint, source)
                # A peer that says it is no worker is a mistake to fix, said at once; the
                # wait goes on all the same: a worker may yet take the port over.
                level = logging.WARNING if told.not_worker else logging.INFO
                why = told.text or str(exc) or type(exc).__name__
                log.log(level, "%s: no answer yet (%s): waiting up to %g s", where, why, wait_s)
            await anyio.sleep(max(0.0, min(0.2, deadline - time.monotonic())))


def worker_endpoint_problem(link: str, endpoint: str) -> str | None:
    """Why `endpoint` cannot name a worker of `link` (the rules policy.worker is held to at
    load, for an endpoint given otherwise: --worker), else None."""
    if link == "openpi":
        if not endpoint.startswith(("ws://", "wss://")):
            return f"{endpoint!r}: the openpi link needs a ws:// or wss:// endpoint"
        return port_problem(endpoint)
    return worker_problem(endpoint)


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
    rings: Mapping[str, FrameRing],
    send_down: Callable[[Any], None],
    worker_failed: Callable[[], str],
    counters: LinkCounters | None = None,
    on_lost: Callable[[str, str], None] | None = None,
    task: Callable[[], str] = lambda: "",
    wait_s: float = HELLO_DEADLINE_S,
    source: str = "policy.worker",
) -> PolicyLink:
    """Hello (retried while the worker comes up, `wait_s` at most), then the link
    (build_link)."""
    client, hs = await hello(cfg, endpoint, worker_failed, wait_s=wait_s, source=source)
    try:
        return build_link(
            cfg, endpoint, client, hs, steps, rings, send_down, counters, on_lost, task
        )
    except StartupError:
        await client.close()
        raise


def build_link(
    cfg: Config,
    endpoint: str,
    client: PolicyClient,
    hs: Handshake,
    steps: StepRing,
    rings: Mapping[str, FrameRing],
    send_down: Callable[[Any], None],
    counters: LinkCounters | None = None,
    on_lost: Callable[[str, str], None] | None = None,
    task: Callable[[], str] = lambda: "",
) -> PolicyLink:
    """The window planner, the uploads (when the worker has an observe endpoint) and the
    act link, sized to the contract in force; StartupError (or ContractError) when the
    worker's contract cannot be used."""
    obs, actions = contract_in_force(cfg, hs)
    limits = ChunkLimits.for_robot(cfg)
    try:
        limits.check_hz(actions.hz if actions is not None else None, cfg.control.hz)
    except ChunkRefused as exc:
        raise StartupError(f"policy worker at {endpoint}: {exc}") from None
    resolved = obs.resolve(cfg.control.hz) if obs is not None else None
    planner = WindowPlanner(resolved, cfg.observation_keys)
    steps.keep = planner.lookback + 2 * int(cfg.control.hz) + 16
    counters = counters or LinkCounters()
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
        on_lost=on_lost,
        task=task,
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


def observe_address(observe: str, act_endpoint: str) -> str:
    """The observe endpoint to connect to: a tcp wildcard host (0.0.0.0, *, ::) that the
    worker bound is replaced by the host the act endpoint named."""
    prefix = "tcp://"
    if not (observe.startswith(prefix) and act_endpoint.startswith(prefix)):
        return observe
    host, _, port = observe[len(prefix) :].rpartition(":")
    if host not in ("0.0.0.0", "*", "[::]", "::"):
        return observe
    act_host = act_endpoint[len(prefix) :].rpartition(":")[0]
    return f"{prefix}{act_host}:{port}"
