"""What the main process starts and watches: the shared memory it owns, the control
process, one process per camera and (unless a remote worker is named) a local policy worker.

Each child gets everything it needs on its command line as one JSON argument (the
validated config, endpoints, shared-memory names), so a child never re-reads files that
could have changed since the daemon validated them. The control process and the local
worker run numpy with one BLAS thread: their numbers are tiny and the control process
locks every page it touches.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from robotd.config import Config
from robotd.exits import exit_words
from robotd.runtime.supervisor import Child, Supervisor, python_module
from robotd.shm import SHM_DIR, FrameRing, ring_slots, unlink_prefix

SHM_PREFIX = "robotd-"
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# The control process: one malloc arena (each thread's own reserves 64 MiB, all of it
# counted by mlockall), one BLAS thread.
CONTROL_ENV = {**ONE_BLAS_THREAD, "MALLOC_ARENA_MAX": "1"}


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


@dataclass(frozen=True)
class LaneEndpoints:
    up: str  # main's PULL
    down: str  # the control process's private PULL
    estop: str  # lane.sock


def control_argv(
    cfg: Config,
    run_id: str,
    ends: LaneEndpoints,
    shared: Shared,
    config_dir: Path | None = None,
) -> list[str]:
    from robotd.control.ports import ControlSpec

    spec = ControlSpec(
        config_dir=None if config_dir is None else str(config_dir),
        config=cfg.model_dump(mode="json"),
        run_id=run_id,
        up=ends.up,
        down=ends.down,
        estop=ends.estop,
        shm_prefix=shared.prefix,
        rings={n: r.name for n, r in shared.rings.items()},
    )
    return python_module("robotd.control.process", msgspec.json.encode(spec).decode())


def camera_argv(
    cfg: Config, name: str, shared: Shared, config_dir: Path | None = None
) -> list[str]:
    cam = cfg.cameras[name]
    spec = {
        "config_dir": None if config_dir is None else str(config_dir),
        "name": name,
        "driver": cam.driver,
        "width": cam.width,
        "height": cam.height,
        "fps": cam.fps,
        "options": cam.options,
        "ring": shared.rings[name].name,
        "shm_prefix": shared.prefix,
    }
    return python_module("robotd.runtime.camera_proc", json.dumps(spec))


def worker_argv(cfg: Config, endpoint: str) -> list[str]:
    """The local policy worker: `robotd serve` on the config's policy and arguments."""
    p = cfg.policy
    args: dict[str, Any] = p.args
    return python_module(
        "robotd",
        "serve",
        p.serve,
        "--bind",
        endpoint,
        "--args-json",
        json.dumps(args),
        "--copies",
        str(p.copies),
        "--hang-s",
        str(p.hang_s),
        "--first-call-s",
        str(p.first_call_s),
    )


class Children:
    """Starts the children under a Supervisor and decides what each one's exit means.

    - control: the robot's lane is gone; `on_control_exit` stops the daemon (never restarted).
    - a camera: its frames go stale (no act is asked from them); restarted.
    - the local worker: before it served, start-up fails with `worker_failed`; after, the
      episode is lost on the robot (`on_worker_lost`) and the worker restarted.
    Restarts back off (the Supervisor's: 1 s doubling to 30 s while a child keeps dying
    young), so a camera on a bad device is not restarted, and logged, every second.
    """

    def __init__(
        self,
        cfg: Config,
        sup: Supervisor,
        *,
        on_control_exit: Callable[[int], None],
        on_worker_lost: Callable[[str], None],
        served: Callable[[], bool],
        config_dir: Path | None = None,
        lock_fd: int | None = None,
    ) -> None:
        self.cfg = cfg
        # the run directory's lock, held by the control lane too: a lane that outlives
        # this process (holding the robot, then its e-stop) keeps the directory its own
        self.lock_fd = lock_fd
        self.config_dir = config_dir
        self.sup = sup
        self._on_control_exit = on_control_exit
        self._on_worker_lost = on_worker_lost
        self._served = served
        self.worker_failed = ""

    async def start(
        self, run_id: str, ends: LaneEndpoints, shared: Shared, local_worker: str | None
    ) -> None:
        """The control process, the cameras and, given its endpoint, the local worker."""
        argv = control_argv(self.cfg, run_id, ends, shared, self.config_dir)
        held = () if self.lock_fd is None else (self.lock_fd,)
        lane = Child("control", argv, self._control_exit, env=CONTROL_ENV, pass_fds=held)
        await self.sup.start(lane)
        for name in self.cfg.cameras:
            argv = camera_argv(self.cfg, name, shared, self.config_dir)
            await self.sup.start(Child(f"camera:{name}", argv, self._camera_exit))
        if local_worker is not None:
            argv = worker_argv(self.cfg, local_worker)
            await self.sup.start(Child("worker", argv, self._worker_exit, env=ONE_BLAS_THREAD))

    def control_alive(self) -> bool:
        return self.alive("control")

    def alive(self, name: str) -> bool:
        child = self.sup.children.get(name)
        return child is not None and child.process is not None and child.process.returncode is None

    async def _control_exit(self, child: Child, code: int) -> bool:
        child.said = "the control lane is gone: stopping"
        self._on_control_exit(code)
        return False

    async def _camera_exit(self, child: Child, code: int) -> bool:
        child.said = "its frames go stale, no act is asked"
        return True

    async def _worker_exit(self, child: Child, code: int) -> bool:
        if not self._served():
            self.worker_failed = f"the local policy worker {exit_words(code)} before it served"
            return False
        child.said = "the local policy worker is gone, the robot holds"
        self._on_worker_lost(f"local worker {exit_words(code)}")
        return True
