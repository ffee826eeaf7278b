"""What the worker keeps about its copies of the policy and the calls waiting for them."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from robotd.worker.runners import Runner

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class CopyOptions:
    """`copies`: copy processes kept running (each holds one episode at a time; the idle ones
    are warm spares); 0: one copy in a thread of the worker, without isolation. `hang_s`: a
    call into a copy (an act with its reset, an end) unanswered this long is a hang: the copy
    is killed and its episode lost; `first_call_s` replaces it for a copy's first call (its
    policy's warm-up: JIT compilation, CUDA kernels, caches, which can take tens of seconds
    once and never again), when longer. `start_s`: a copy not ready this long after it
    started is given up. `memory_bytes`: each copy process's address-space limit (RLIMIT_AS; 0:
    none), so that a runaway allocation is a MemoryError in the copy, not an OOM kill.
    `inline` (with copies=0): the copy is the worker's poll loop itself, each act a plain
    call (robotd.worker.runners.InlineRunner): the shortest round trip, and nothing watched
    (no hang is detected; pings wait while the policy computes)."""

    copies: int = 1
    hang_s: float = 5.0
    first_call_s: float = 60.0
    start_s: float = 120.0
    memory_bytes: int = 0
    inline: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.copies <= 64:
            raise ValueError(f"copies: {self.copies} is not in 0..64")
        if self.inline and self.copies != 0:
            raise ValueError(f"inline runs one copy in the worker: copies is {self.copies}, not 0")
        if not 0 < self.hang_s <= 3600:
            raise ValueError(f"hang_s: {self.hang_s} s is not in (0, 3600]")
        if not 0 < self.first_call_s <= 3600:
            raise ValueError(f"first_call_s: {self.first_call_s} s is not in (0, 3600]")
        if not 0 < self.start_s <= 86400:
            raise ValueError(f"start_s: {self.start_s} s is not in (0, 86400]")
        if self.memory_bytes < 0:
            raise ValueError(f"memory_bytes: {self.memory_bytes} < 0")


@dataclass(slots=True)
class Task:
    """A call waiting for a copy: an act (with its window) or an end; `route` and `rid` say
    whom to answer; `seq` numbers it towards its copy."""

    kind: str  # "act" | "end"
    route: list[bytes]
    rid: int
    episode: str
    step: int = 0
    steps: list[int] | None = None
    observations: list[dict[str, Any]] | None = None
    rtc: dict[str, Any] | None = None  # the act's frozen prefix (requests.rtc_field)
    task: str = ""  # the episode's task text
    received: float = field(default_factory=time.perf_counter)
    seq: int = 0
    sent: float = 0.0  # perf_counter when it went to the copy


@dataclass(eq=False, slots=True)
class Slot:
    """One copy: its runner, its state (starting | ready), the episode bound to it, and the
    calls queued for it (`current`: being prepared or computed; `deadline`: hang time)."""

    id: int
    identity: bytes
    runner: Runner
    started: float  # monotonic
    oom_before: int | None
    state: str = "starting"
    episode: str | None = None
    fifo: deque[Task] = field(default_factory=deque)
    current: Task | None = None
    deadline: float | None = None
    answered: int = 0
    last_used: float = 0.0
    ready_at: float | None = None
    sample_at: float = 0.0

    @property
    def warm(self) -> bool:
        """It answered a call: its policy's warm-up is behind it."""
        return self.answered > 0

    @property
    def idle(self) -> bool:
        return self.state == "ready" and self.episode is None and not self.fifo and not self.current

    def health(self, now: float) -> dict[str, Any]:
        """This copy in a ping reply."""
        if self.state == "starting":
            state = "starting"
        elif self.current is not None:
            state = "busy"
        else:
            state = "bound" if self.episode is not None else "idle"
        busy_s = None
        if self.current is not None and self.current.sent:
            busy_s = round(time.perf_counter() - self.current.sent, 4)
        memory = self.runner.memory()
        return {
            "id": self.id,
            "pid": self.runner.pid,
            "state": state,
            "episode": self.episode,
            "busy_s": busy_s,
            "queued": len(self.fifo),
            "answered": self.answered,
            "rss_mib": round(memory.rss / MIB, 1) if memory.rss else None,
            "up_s": round(now - self.started, 3),
        }


def error(rid: int | None, code: str, message: str, **extra: Any) -> dict[str, Any]:
    """An error reply to request `rid`."""
    return {"id": rid, "ok": False, "error": {"code": code, "message": message, **extra}}


def answer(task: Task, msg: dict[str, Any]) -> dict[str, Any]:
    """A copy's `done` as the reply to the client's request (its fields checked: a copy runs
    the policy's code, so its answer is not taken on trust)."""
    if msg.get("ok") is not True:
        err = msg.get("error") if isinstance(msg.get("error"), dict) else {}
        code, text = err.get("code"), err.get("message")
        if not isinstance(code, str) or not isinstance(text, str):
            code, text = "internal", "the copy answered a malformed error"
        return error(task.rid, code, text)
    if task.kind == "end":
        return {"id": task.rid, "ok": True, "result": {}}
    result = msg.get("result") if isinstance(msg.get("result"), dict) else {}
    timing = result.get("timing") if isinstance(result.get("timing"), dict) else {}
    infer_ms, begin_ms = timing.get("infer_ms"), timing.get("begin_ms")
    rows = result.get("actions")
    if not all(isinstance(v, float) and v >= 0 for v in (infer_ms, begin_ms)) or not (
        isinstance(rows, np.ndarray) and rows.ndim == 2
    ):
        return error(task.rid, "internal", "the copy answered a malformed result")
    queue_ms = (task.sent - task.received) * 1e3 + begin_ms
    return {
        "id": task.rid,
        "ok": True,
        "result": {
            "actions": rows,
            "timing": {"infer_ms": infer_ms, "queue_ms": max(0.0, queue_ms)},
            "step": task.step,
            "episode": task.episode,
        },
    }
