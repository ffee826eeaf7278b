"""What the main process starts: the shared memory it owns and the argv of each child.

Each child gets everything it needs on its command line as one JSON argument (the
validated config, endpoints, shared-memory names), so a child never re-reads files
that could have changed since the daemon validated them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robotd.config import Config
from robotd.shm import SHM_DIR, FrameRing, ring_slots, unlink_prefix
from robotd.supervisor import python_module

SHM_PREFIX = "robotd-"


def lane_endpoint(run_dir: Path) -> str:
    """The control lane's inbound (PULL) endpoint in a run directory."""
    return f"ipc://{run_dir}/lane.sock"


@dataclass
class Shared:
    """Shared memory owned by this main process (unlinked at exit)."""

    prefix: str  # drivers put what they share under it (the sim world); all unlinked at exit
    rings: dict[str, FrameRing] = field(default_factory=dict)

    def unlink(self) -> None:
        for ring in self.rings.values():
            ring.close()
            ring.unlink()
        unlink_prefix(self.prefix)


def clean_stale_shm() -> None:
    """Remove shared memory left by daemons that died without cleaning up (dead pids)."""
    for path in Path(SHM_DIR).glob(f"{SHM_PREFIX}*"):
        parts = path.name.split("-")
        if len(parts) >= 2 and parts[1].isdigit() and not Path(f"/proc/{parts[1]}").exists():
            unlink_prefix(f"{SHM_PREFIX}{parts[1]}-")


def create_shared(cfg: Config) -> Shared:
    """One frame ring per camera, named by our pid (the prefix is the drivers' too)."""
    clean_stale_shm()
    shared = Shared(prefix=f"{SHM_PREFIX}{os.getpid()}-")
    for name, cam in cfg.cameras.items():
        slots = ring_slots(cam.fps, cam.ring_seconds)
        shared.rings[name] = FrameRing.create(
            shared.prefix + name, (cam.height, cam.width, 3), slots
        )
    return shared


def control_argv(cfg: Config, run_id: str, up: str, down: str, shared: Shared) -> list[str]:
    spec = {
        "config": cfg.model_dump(mode="json"),
        "run_id": run_id,
        "up": up,
        "down": down,
        "shm_prefix": shared.prefix,
        "rings": {n: r.name for n, r in shared.rings.items()},
    }
    return python_module("robotd.control.process", json.dumps(spec))


def camera_argv(cfg: Config, name: str, shared: Shared) -> list[str]:
    cam = cfg.cameras[name]
    spec = {
        "name": name,
        "driver": cam.driver,
        "width": cam.width,
        "height": cam.height,
        "fps": cam.fps,
        "options": cam.options,
        "ring": shared.rings[name].name,
        "shm_prefix": shared.prefix,
    }
    return python_module("robotd.camera_proc", json.dumps(spec))


def worker_argv(cfg: Config, endpoint: str) -> list[str]:
    """The local policy worker: `robotd serve` on the config's policy and arguments."""
    args: dict[str, Any] = cfg.policy.args
    return python_module(
        "robotd", "serve", cfg.policy.serve, "--bind", endpoint, "--args-json", json.dumps(args)
    )
