"""The policy side of the main process: turns the control lane's asks into chunks.

The control lane publishes every step's record and, when its queue runs low, an
ask naming the step. Here each ask becomes an act: the window the policy declared
is planned (robotd.link.windows); with an observe connection (robotd.link.uplink) the
act names its steps, which went up ahead of it, and what the worker still lacks goes
inline on a second try; without one, the window's steps are resolved from the step
ring and the shared-memory frame rings and sent inline. The chunk goes back down to
the control lane, named by the ask it answers. Nothing here runs on the control lane.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from robotd.contract import Actions
from robotd.contract.answers import oversized
from robotd.lane.messages import Ask, ChunkRows, Rows
from robotd.link.chunks import ChunkLimits, ChunkRefused, prepare
from robotd.link.client import ActResult, PolicyClient, PolicyError
from robotd.link.failures import fail_ask
from robotd.link.frame_tap import FrameTap, tap_window
from robotd.link.replies import episode_lost
from robotd.link.rtc import RtcRefused, rtc_request
from robotd.link.steps import FrameLost, LinkCounters, StepReader
from robotd.link.windows import Window, WindowPlanner, assemble

if TYPE_CHECKING:
    from robotd.link.uplink import Uplink

log = logging.getLogger("robotd.link")

# Error codes after which the worker handed the act to the policy (it released old steps).
_DISPATCHED = ("policy_error", "bad_actions", "bad_frame")


@dataclass(slots=True)
class _Ask:
    id: int
    wep: str
    step: int
    window: Window
    prev: int | None  # the act before it (restored if this one never reaches the policy)
    asked: float  # perf_counter when the ask was taken up
    inputs: dict[str, list[Any]] | None = None  # assembled here when sent inline
    rtc: dict[str, Any] | None = None  # the frozen prefix, in the policy's time base


class ActLink:
    """Answers asks: plan the window, get it to the worker, act, send the chunk down.

    With `uplink`, the act names its window (uploaded ahead) and waits on the worker at
    most `stream_wait_s` for what has not arrived; without, the window goes inline.
    """

    def __init__(
        self,
        client: PolicyClient,
        planner: WindowPlanner,
        reader: StepReader,
        send_down: Callable[[Any], None],
        *,
        control_hz: float,
        actions: Actions | None,
        limits: ChunkLimits,
        uplink: Uplink | None = None,
        stream_wait_s: float = 10.0,
        counters: LinkCounters | None = None,
        on_lost: Callable[[str, str], None] | None = None,
        task: Callable[[], str] = lambda: "",
    ) -> None:
        self.client = client
        self.planner = planner
        self.reader = reader
        self.send_down = send_down
        self.control_hz = control_hz
        self.actions = actions
        self.limits = limits
        self.uplink = uplink
        self.stream_wait_s = stream_wait_s
        self.counters = counters or LinkCounters()
        # (episode, cause): the worker's copy of the policy holding the episode is gone
        self.on_lost = on_lost
        self.task = task  # the running episode's task text (operator's robotctl start --task)
        self._prev_act: dict[str, int] = {}
        self.tap: FrameTap | None = None  # told the frames of inline windows (the trace)
        self.stopping = False  # set as the daemon stops: acts cut short are not errors

    def begin(self, ask: Ask) -> _Ask | None:
        """The part of an ask done at once, in message order: plan the window and tell the
        uplink (or read the window out of the rings). None if it failed (reported)."""
        wep, step, ask_id = ask.wep, ask.s, ask.id
        prev = self._prev_act.get(wep)
        try:
            a = _Ask(ask_id, wep, step, self.planner.plan(step, prev), prev, time.perf_counter())
        except ValueError as exc:  # an ask not after the previous one: never act on it
            self._fail(ask_id, f"cannot plan the window: {exc}")
            return None
        self._prev_act[wep] = step  # (taken back in _settle if the act never reaches it)
        try:
            a.rtc = rtc_request(ask.rtc, self.actions, self.control_hz, self.limits.dim)
            if self.uplink is not None:
                self.uplink.on_ask(wep, step, ask.queue)
                self.uplink.ensure(wep, a.window.needed())
            else:
                a.inputs = assemble(a.window, lambda s, k: self.reader.value(wep, s, k))
                tap_window(self.tap, wep, a.window, a.inputs)
            return a
        except FrameLost as exc:
            self.counters.skipped_frames += 1
            reason = f"window incomplete: {exc}"
        except RtcRefused as exc:
            reason = f"cannot prepare the act: {exc}"
        except Exception as exc:  # a bug must not leave the ask unanswered
            log.exception("ask %d at step %d: cannot prepare the act", ask_id, step)
            reason = f"cannot prepare the act: {type(exc).__name__}: {exc}"
        self._settle(a, handed=False)
        self._fail(ask_id, reason)
        return None

    async def finish(self, a: _Ask) -> None:
        """Act and send the chunk (or act_failed) down. Never raises: every failure becomes
        act_failed, an unexpected one logged with its traceback."""
        handed = False
        try:
            result = await self._act(a)
            handed = True
            rows = prepare(result.actions, self.actions, self.control_hz, self.limits)
        except ChunkRefused as exc:
            reason = f"chunk refused: {exc}"
        except FrameLost as exc:
            reason = f"window incomplete: {exc}"
        except PolicyError as exc:
            lost = episode_lost(exc)
            if lost is not None and self.on_lost is not None:
                self._settle(a, True)
                self.on_lost(a.wep, lost)  # the session resets the episode: no act_failed
                return
            handed = exc.code in _DISPATCHED
            reason = _refused_by_worker(exc, self.limits) or f"act failed: PolicyError: {exc}"
        except (TimeoutError, OSError) as exc:
            reason = f"act failed: {type(exc).__name__}: {exc}"
        except Exception as exc:
            log.exception("ask %d at step %d: the act failed", a.id, a.step)
            reason = f"act failed: {type(exc).__name__}: {exc}"
        else:
            reason = None
        self._settle(a, handed)
        if reason is not None:
            self._fail(a.id, reason)
            return
        self.counters.acts += 1
        self.counters.rtt_ms.add((time.perf_counter() - a.asked) * 1e3)
        self.counters.infer_ms.add(result.infer_ms)
        self.send_down(ChunkRows(a.id, a.wep, a.step, Rows.of(rows)))

    async def _act(self, a: _Ask) -> ActResult:
        if a.inputs is not None:
            return await self.client.act(
                a.wep,
                a.step,
                list(a.inputs["steps"]),
                a.inputs["observations"],
                rtc=a.rtc,
                task=self.task()[:2000],
            )
        return await self._act_named(a)

    def _settle(self, a: _Ask, handed: bool) -> None:
        """The act is over. If it never reached the policy, the next act's window counts
        from the act before it (the policy never saw this one's steps)."""
        if not handed and self._prev_act.get(a.wep) == a.step:
            if a.prev is None:
                self._prev_act.pop(a.wep, None)
            else:
                self._prev_act[a.wep] = a.prev
        if self.uplink is not None:
            self.uplink.settled(a.wep, a.step, handed)

    async def _act_named(self, a: _Ask) -> ActResult:
        """The act naming its steps; once more with the missing ones inline if the worker
        lacks some (FrameLost if those are gone robot-side too)."""
        assert self.uplink is not None
        steps = list(a.window.steps)
        reads = [list(a.window.keys_at[s]) for s in steps]
        below = self.uplink.release_point(a.step)
        timeout = self.client.timeout_s + self.stream_wait_s
        inline: list[dict[str, Any]] | None = None
        try:
            for attempt in (1, 2):
                try:
                    result = await self.client.act_steps(
                        a.wep,
                        a.step,
                        steps,
                        reads,
                        inline=inline,
                        release_below=below,
                        wait_s=self.stream_wait_s,
                        timeout_s=timeout,
                        rtc=a.rtc,
                        task=self.task()[:2000],
                    )
                    break
                except PolicyError as exc:
                    if exc.code != "missing_steps" or attempt == 2:
                        raise
                    missing = exc.missing(a.window.needed())
                    log.warning(
                        "act at step %d: the worker lacks %d uploads (%s); sending them inline",
                        a.step,
                        len(missing),
                        exc.message,
                    )
                    inline = await self.uplink.inline(a.wep, [(s, k) for s, k, _ in missing])
        except PolicyError as exc:
            if exc.code in _DISPATCHED:
                self.uplink.released(a.wep, below)
            raise
        self.uplink.released(a.wep, below)
        return result

    def _fail(self, ask_id: int, reason: str) -> None:
        fail_ask(self.counters, self.send_down, ask_id, reason, stopping=self.stopping)

    def forget(self, wep: str) -> None:
        self._prev_act.pop(wep, None)
        if self.uplink is not None:
            self.uplink.end(wep)


def _refused_by_worker(exc: PolicyError, limits: ChunkLimits) -> str | None:
    """For an answer the worker refused as over what any robot plays (its shape named,
    robotd.contract.answers), the refusal in this robot's own terms, as chunks.prepare words
    it had the rows come (this robot's bound is the tighter one); None for any other error."""
    shape = oversized(exc.message) if exc.code == "bad_actions" else None
    if shape is None:
        return None
    rows, columns = shape
    if rows > limits.max_rows:
        ours = f"{rows} rows, over policy.max_chunk_rows = {limits.max_rows}"
    elif limits.dim and columns != limits.dim:
        ours = f"{columns} columns, but this robot has {limits.dim} joints"
    else:  # within this robot's bounds (a robot of over 64 joints): as the worker said it
        return None
    return f"chunk refused: {ours} (the worker's refusal: {exc.message[:300]})"
