"""The worker's copies of the policy as processes (or a thread): started, watched, replaced.

`Copies` keeps `options.copies` copies running (one thread copy for `copies=0`). It finds a
copy that ended (its pidfd, or its exit status), one that hangs (a call unanswered past its
deadline: killed), one that never became ready (killed after start_s), samples each copy's
memory, and starts a new copy for each one gone, backing off (1 s doubling to 30 s) after a
copy that could not start or was lost within STABLE_S of becoming ready (a policy that
crashes on every act is restarted ever more rarely, not as fast as copies can start); the
backoff starts over once STABLE_S passed without such a failure, and a copy lost after
serving that long is replaced at once. What a lost copy means for its episode is the
caller's (`CopyEvents`). Single-threaded: called from the worker's poll loop.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from typing import Any, Protocol

from robotd.backoff import Backoff
from robotd.worker import pipe
from robotd.worker.child import EXIT_MEMORY
from robotd.worker.death import Loss, describe_exit, oom_kills
from robotd.worker.params import Param, ParamError, param_from_wire
from robotd.worker.runners import InlineRunner, ProcessRunner, Runner, ThreadRunner
from robotd.worker.slots import CopyOptions, Slot

log = logging.getLogger("robotd.worker")

SAMPLE_S = 0.25  # how often each copy's memory is read
BACKOFF_MAX_S = 30.0  # between attempts to start a copy after one failed to start
STABLE_S = 30.0  # a copy ready this long went well; failures further apart start over
_SAME = ("policy", "contract", "params")  # what every copy must declare alike


class CopyEvents(Protocol):
    def copy_ready(self, slot: Slot) -> None:
        """`slot` can take calls now."""

    def copy_lost(self, slot: Slot, loss: Loss, now: float) -> None:
        """`slot` (ready before) is gone and was dropped; answer what it held."""

    def no_copy(self, why: str) -> None:
        """A copy could not start and none is ready: nothing can serve for now."""


class Copies:
    """The copy processes of policy `spec`, each on a channel of its own (the slot's
    `runner.channel`). `ready_message` is the first ready copy's `ready` (the contract);
    `fatal` says why the first copy could not start (the worker cannot serve)."""

    def __init__(
        self,
        spec: str,
        kwargs: dict[str, Any],
        options: CopyOptions,
        events: CopyEvents,
    ) -> None:
        self.spec, self.kwargs, self.options = spec, kwargs, options
        self.events = events
        self.slots: dict[bytes, Slot] = {}
        self.ready_message: dict[str, Any] | None = None
        self.declared: dict[str, Param] = {}
        self.fatal: str | None = None
        self.last_start_error: str | None = None
        self.counts = {"copies_started": 0, "copies_lost": 0, "start_failures": 0}
        self.stopping = False
        self._ids = itertools.count(1)
        self._backoff = Backoff(max_s=BACKOFF_MAX_S)
        self._backoff_until = 0.0
        self._failed_at = -math.inf  # monotonic, the last start failure or young loss
        self._left: list[Runner] = []  # dropped runners not reaped yet
        self.due = 0.0  # monotonic time from which `check` has something to do
        self.generation = 0  # changes whenever a copy is added or dropped

    @property
    def wanted(self) -> int:
        return max(1, self.options.copies)

    def start(self) -> None:
        self._spawn_missing(time.monotonic())

    def _spawn_missing(self, now: float) -> None:
        while not self.stopping and len(self.slots) < self.wanted and now >= self._backoff_until:
            n = next(self._ids)
            identity = f"copy-{n}".encode()
            runner: Runner
            if self.options.inline:
                runner = InlineRunner(identity, self.spec, self.kwargs)
            elif self.options.copies == 0:
                runner = ThreadRunner(identity, self.spec, self.kwargs)
            else:
                runner = ProcessRunner(
                    identity, self.spec, self.kwargs, self.options.memory_bytes
                )
            slot = Slot(n, identity, runner, now, oom_kills())
            runner.start()
            self.slots[identity] = slot
            self.generation += 1
            self.counts["copies_started"] += 1

    def fds(self) -> list[int]:
        """Descriptors readable when a copy ends (pidfds)."""
        return [fd for s in self.slots.values() if (fd := s.runner.fileno()) is not None]

    def channels(self) -> dict[int, Slot]:
        """The open channels' descriptors, with their copies."""
        open_ = [s for s in self.slots.values() if not s.runner.channel.closed]
        return {s.runner.channel.fileno(): s for s in open_}

    def next_check(self, now: float) -> float:
        """Seconds until `check` has something to do (a hang, a start deadline, a retry)."""
        times = [now + SAMPLE_S]
        for slot in self.slots.values():
            if slot.deadline is not None:
                times.append(slot.deadline)
            if slot.state == "starting":
                times.append(slot.started + self.options.start_s)
        if len(self.slots) < self.wanted:
            times.append(self._backoff_until)
        return max(0.0, min(times) - now)

    def check(self, now: float) -> None:
        """Find copies that ended, hung or never became ready; sample memory; start copies."""
        for slot in list(self.slots.values()):
            code = slot.runner.exited()
            if code is not None:
                pid = slot.runner.pid or 0
                memory = slot.runner.memory()
                loss = describe_exit(code, pid, memory, slot.oom_before, EXIT_MEMORY)
                self.lose(slot, loss, now)
            elif slot.deadline is not None and now >= slot.deadline:
                slot.runner.kill()
                task = slot.current
                what = f"the act at step {task.step}" if task and task.kind == "act" else "end"
                allowed = self.allowance(slot)
                text = f"hung: no answer to {what} within {allowed:g} s"
                if allowed > self.options.hang_s:
                    text += " (its first call: first_call_s; later ones hang_s)"
                text += " (killed)"
                self.lose(slot, Loss("hung", text), now)
            elif slot.state == "starting" and now - slot.started > self.options.start_s:
                slot.runner.kill()
                self._start_failed(slot, f"not ready within {self.options.start_s:g} s", now)
            elif now >= slot.sample_at:
                self.sample(slot, now)
        for runner in [r for r in self._left if r.exited() is not None]:
            runner.close()
            self._left.remove(runner)
        self._spawn_missing(now)
        self.due = now + self.next_check(now)

    def sample(self, slot: Slot, now: float) -> None:
        slot.runner.sample()
        slot.sample_at = now + SAMPLE_S

    def lose(self, slot: Slot, loss: Loss, now: float) -> None:
        """`slot` stopped: a start that failed, or a lost copy (told to the events)."""
        if slot.identity not in self.slots:
            return
        if slot.state == "starting":
            self._start_failed(slot, loss.message, now)
            return
        self._drop(slot)
        self.counts["copies_lost"] += 1
        up = now - (slot.ready_at if slot.ready_at is not None else slot.started)
        # One line a loss, whether or not it held an episode (the pool says which it lost):
        # an idle spare that dies is replaced, and the log is where an operator learns why.
        if up < STABLE_S:  # lost young: the next may well go the same way
            delay = self._failed(now)
            log.warning("copy %d (pid %s) lost %.1f s after it was ready: the next starts in %g s"
                        " (%s)", slot.id, slot.runner.pid, up, delay, loss.message)
        elif not self.stopping:
            log.warning("copy %d (pid %s) lost after %.0f s serving: a new copy starts now (%s)",
                        slot.id, slot.runner.pid, up, loss.message)
        self.events.copy_lost(slot, loss, now)
        self._spawn_missing(now)

    def _failed(self, now: float) -> float:
        """A start failure or a young loss at `now`: the wait before the next copy starts
        (the backoff over again when the last failure is STABLE_S of running behind us)."""
        if now - self._failed_at >= STABLE_S + self._backoff.delay_s:
            self._backoff.reset()
        self._failed_at = now
        delay = self._backoff.next()
        self._backoff_until = now + delay
        return delay

    def _drop(self, slot: Slot) -> None:
        self.slots.pop(slot.identity, None)
        self.generation += 1
        self.due = 0.0  # a replacement to start, a runner to reap
        slot.runner.kill()
        self._left.append(slot.runner)

    def _start_failed(self, slot: Slot, why: str, now: float) -> None:
        self._drop(slot)
        text = f"copy {slot.id} (pid {slot.runner.pid}) could not start: {why}"
        self.counts["start_failures"] += 1
        self.last_start_error = text
        if self.ready_message is None:
            self.fatal = why
            return
        delay = self._failed(now)
        log.error("%s; trying again in %g s", text, delay)
        if not any(s.state == "ready" for s in self.slots.values()):
            self.events.no_copy(text)

    def on_control(self, slot: Slot, kind: str, msg: dict[str, Any], now: float) -> None:
        """A copy's `boot`, `ready` or `failed`."""
        self.due = 0.0  # its state changes: deadlines to look at again
        if kind == "boot":
            init = slot.runner.init_frames()
            if init is not None:
                slot.runner.channel.send(init)
        elif kind == "failed" and slot.state == "starting":
            self._start_failed(slot, str(msg.get("error"))[:2000], now)
        elif kind == "ready" and slot.state == "starting":
            problem = self._adopt(msg)
            if problem is not None:
                self._start_failed(slot, problem, now)
                return
            slot.state, slot.ready_at, slot.last_used = "ready", now, now
            self.sample(slot, now)
            log.info(
                "copy %d (pid %s) ready in %.2f s", slot.id, slot.runner.pid, now - slot.started
            )
            self.events.copy_ready(slot)

    def _adopt(self, msg: dict[str, Any]) -> str | None:
        """Take the first copy's contract and parameters; later copies must say the same."""
        if self.ready_message is not None:
            if any(msg.get(k) != self.ready_message[k] for k in _SAME):
                return "it declared another contract or parameters than the first copy"
            return None
        try:
            declared = [param_from_wire(p) for p in msg.get("params") or []]
        except ParamError as err:
            return f"bad parameter declaration: {err}"
        self.declared = {p.name: p for p in declared}
        self.ready_message = {k: msg.get(k) for k in _SAME}
        return None

    def allowance(self, slot: Slot) -> float:
        """How long `slot`'s call may take before it is a hang: hang_s, or first_call_s
        (when longer) until the copy answered once."""
        o = self.options
        return o.hang_s if slot.warm else max(o.hang_s, o.first_call_s)

    def send(self, slot: Slot, frames: list[Any]) -> None:
        """A call to `slot`: sent now, to be answered within its allowance."""
        assert slot.current is not None
        slot.runner.channel.send(frames)
        slot.current.sent = time.perf_counter()
        slot.deadline = time.monotonic() + self.allowance(slot)
        self.due = min(self.due, slot.deadline)

    def stop(self, grace_s: float = 2.0) -> None:
        """End every copy: SIGTERM (a thread: `stop`), then SIGKILL after `grace_s`."""
        self.stopping = True
        runners = [s.runner for s in self.slots.values()] + self._left
        waited = [r for r in runners if not isinstance(r, ThreadRunner) or r in self._live()]
        for slot in self.slots.values():
            if isinstance(slot.runner, ThreadRunner):
                slot.runner.channel.send(pipe.pack({"k": "stop"}))
            slot.runner.terminate()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(r.exited() is None for r in waited):
            time.sleep(0.01)  # shutting down: a short bounded wait for the copies to go
        for runner in runners:
            runner.close()
        self._left = [r for r in runners if isinstance(r, ThreadRunner) and r.alive]
        self.slots.clear()
        self.generation += 1

    def _live(self) -> list[Runner]:
        return [s.runner for s in self.slots.values()]

    def threads_left(self) -> bool:
        """A thread copy is still running (hung): the zmq context cannot be terminated."""
        return any(isinstance(r, ThreadRunner) and r.alive for r in self._left)
