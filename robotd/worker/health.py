"""What a `ping` answers: the worker's copies of the policy and how they fare."""

from __future__ import annotations

import time
from typing import Any

from robotd.worker.act_requests import ActRequests
from robotd.worker.pool import Pool


def health(
    pool: Pool, acts: ActRequests, started: float, instance: str, episode: str | None
) -> dict[str, Any]:
    """The ping result (docs/protocol.md); `instance` this worker process's (as its hello
    says); with `episode`, what is known of that episode."""
    now = time.monotonic()
    copies = [slot.health(now) for slot in pool.slots.values()]

    def count(*states: str) -> int:
        return sum(1 for c in copies if c["state"] in states)

    last = pool.last_loss
    out: dict[str, Any] = {
        "uptime_s": round(now - started, 3),
        "instance": instance,
        "pool": {
            "wanted": pool.options.copies,
            "running": len(copies),
            "ready": count("idle", "bound", "busy"),
            "idle": count("idle"),
            "busy": count("busy"),
            "starting": count("starting"),
            "isolated": pool.options.copies > 0,
            "hang_s": pool.options.hang_s,
            "first_call_s": pool.options.first_call_s,
        },
        "copies": copies,
        "counts": {**pool.copies.counts, "episodes_lost": pool.episodes_lost},
        "queued": pool.queued() + len(acts.parked),
        "last_loss": None
        if last is None
        else {
            "episode": last["episode"],
            "cause": last["cause"],
            "message": last["message"],
            "ago_s": round(now - last["at"], 3),
        },
        "last_start_error": pool.copies.last_start_error,
    }
    if episode is not None:
        out["episode"] = pool.episode_state(episode)
    return out
