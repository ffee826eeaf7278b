"""Policies for the copy tests (tests/test_copies.py): importable by a copy process, which
runs with this directory on its PYTHONPATH. Each misbehaves when the act's observation asks
(`mode`), and answers one row telling what it saw otherwise."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Literal

import numpy as np

from robotd.worker.episode import Episode


class Faulty:
    """No observation contract: handed the act's own observation. Row: [episode.steps,
    acts counted in episode.state, gain, pid, resets, len(label), episode == its id string,
    1 if fast else 0]."""

    def __init__(self, hog_mib: int = 4096) -> None:
        self.hog_mib = hog_mib
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def infer(
        self,
        obs: dict,
        *,
        episode: Episode,
        gain: float = 1.0,
        label: str = "a",
        fast: bool = False,
        speed: Literal["slow", "quick"] = "slow",
        limit: int | None = None,
        buffer: np.ndarray | None = None,  # not settable: not a plain type
    ) -> np.ndarray:
        mode = obs.get("mode")
        if mode == "hang":
            threading.Event().wait()  # forever: the worker must notice and kill the copy
        if mode == "sleep":
            time.sleep(float(obs.get("seconds", 30)))
        if mode == "oom":
            hog = np.ones(self.hog_mib << 20, dtype=np.uint8)  # past the copy's RLIMIT_AS
            return hog[:1].reshape(1, 1).astype(float)
        if mode == "raise":
            raise RuntimeError("asked to raise")
        if mode == "exit":
            os._exit(3)
        if mode == "sys_exit":
            raise SystemExit(4)  # in a copy process: it ends; inline: refused, worker goes on
        if mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        episode.state["acts"] = episode.state.get("acts", 0) + 1
        row = [
            episode.steps,
            episode.state["acts"],
            gain,
            os.getpid(),
            self.resets,
            len(label),
            float(episode == episode.id),
            1.0 if fast else 0.0,
        ]
        return np.array([row], dtype=np.float64)


class BrokenOnReload:
    """Builds once; every later build (a replacement copy) fails, so the worker's retries
    and `no_copy` can be seen. The marker file is the first build's trace."""

    def __init__(self, marker: str) -> None:
        if os.path.exists(marker):
            raise RuntimeError("cannot build twice")
        with open(marker, "w") as f:
            f.write(str(os.getpid()))

    def infer(self, obs: dict) -> list[list[float]]:
        if obs.get("mode") == "exit":
            os._exit(4)
        return [[1.0]]
