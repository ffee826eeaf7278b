"""What the operator socket answers without the control lane: the content, not the wire.

status, stats and verdict are answered from the daemon's own view (robotd.runtime.view);
params from the config and the policy worker; the telemetry message from the view's
summary. robotd.operator.server receives, dispatches and replies; a lane command's answer
is the lane's own status (server.handle_lane), so it is not here.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from robotd.config import Config
from robotd.operator.requests import Request, RequestError, summary
from robotd.runtime.summary import LANE_COUNTERS
from robotd.runtime.view import DaemonView, OperatorPolicy

log = logging.getLogger("robotd.operator")

# The control lane's counters that telemetry carries (the summary has them all).
TELEMETRY_COUNTERS = ("ticks", *LANE_COUNTERS)


def local(view: DaemonView, req: Request) -> Any:
    """The answer to a request the daemon answers from its own view (LOCAL_COMMANDS)."""
    if req.cmd == "status":
        out = {**view.state(), "run_id": view.run_id, "robot": view.robot, "link": view.link()}
        if (trace := view.trace()) is not None:
            out["trace"] = trace
        return out
    if req.cmd == "stats":  # the lane's age first: its numbers may be its last
        return {**view.lane(), **view.summary.to_dict()}
    if req.cmd == "verdict":
        return _verdict(view, req.args)
    raise RequestError("unknown_command", req.cmd)  # unreachable: parse_request checked


def _verdict(view: DaemonView, args: dict[str, Any]) -> dict[str, Any]:
    episode = view.state().get("episode", 0)
    if not isinstance(episode, int) or episode <= 0:
        raise RequestError("bad_state", "no episode has started yet: nothing to judge")
    verdicts = view.summary.verdicts
    index = next((i for i, v in enumerate(verdicts) if v.get("episode") == episode), None)
    if index is not None and not args.get("replace", False):
        first = verdicts[index]
        said = "success" if first.get("success") else "failure"
        when = time.strftime("%H:%M:%S", time.localtime(first.get("time", 0)))
        notes = f" ({summary({'notes': first['notes']})})" if first.get("notes") else ""
        raise RequestError(
            "verdict_exists",
            f"episode {episode} already has a verdict: {said}{notes}, given at {when}; "
            "send it with replace (robotctl verdict --replace) to replace it",
        )
    verdict = {
        "episode": episode,
        "success": args["success"],
        "notes": args.get("notes", ""),
        "time": time.time(),
    }
    if index is None:
        verdicts.append(verdict)
    else:
        verdicts[index] = verdict
    word = "replaced: " if index is not None else ""
    log.info(
        "verdict %sepisode %d %s %s",
        word,
        episode,
        "success" if verdict["success"] else "failure",
        summary({"notes": verdict["notes"]}) if verdict["notes"] else "",
    )
    return verdict


async def params(cfg: Config, policy: OperatorPolicy | None, args: dict[str, Any]) -> Any:
    """Without `set`: the config in force and the policy's inference parameters. With
    `set`: the policy's parameters changed, from its next episode on (never mid-episode;
    the worker checks each against its declared type)."""
    from robotd.link.client import PolicyError

    changes = args.get("set")
    if not changes:
        out: dict[str, Any] = {"config": cfg.model_dump(mode="json")}
        if policy is not None:
            try:
                out["policy"] = (await policy.params(None)).get("params", [])
            except PolicyError as exc:
                out["policy"] = f"{exc.code}: {exc.message}"
        return out
    if policy is None:
        raise RequestError("not_supported", "params: no policy link to set parameters on")
    try:
        result = await policy.params(changes)
    except PolicyError as exc:
        raise RequestError(exc.code, f"params: {exc.message}") from None
    log.info("operator: params set %s (from the next episode on)", summary(changes))
    return result


def telemetry_message(view: DaemonView) -> dict[str, Any]:
    """What one telemetry message carries (the view tolerates any field missing)."""
    s = view.summary
    return {
        "time": time.time(),
        "run_id": view.run_id,
        "state": view.state(),
        "link": view.link(),
        "hz": s.measured_hz(),
        "lateness_us": s.lateness(),
        "counters": {
            **{k: s.count(k) for k in TELEMETRY_COUNTERS},
            **s.uploads(),
            **s.link_counts(),
        },
        "ask_latency": s.ask_latency(),
        "act_rtt_ms": s.act_rtt_ms(),
        "infer_ms": s.infer_ms(),
        "robot": view.robot_state(),
    }
