"""Asks answered by an openpi server: the window read robot-side and sent inline (an openpi
server keeps no stream), mapped onto the server's schema, its answer mapped back onto the
robot's joints and bounded as every chunk is (robotd.link.chunks).

What goes wrong is sorted the way the daemon acts on it: the server failing (its traceback
in a text frame), the connection lost, or no answer in time mean the server-side session is
gone — `on_lost(reason)` (the session holds, reconnects and resets the episode); a reply
or an observation that does not fit the mapping fails the act alone (ActFailed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from robotd.config import Config
from robotd.contract import Actions, Observations, Stream
from robotd.lane.messages import Ask, ChunkRows, Rows, Rtc
from robotd.link.chunks import ChunkLimits, ChunkRefused, prepare
from robotd.link.failures import fail_ask
from robotd.link.frame_tap import FrameTap, tap_window
from robotd.link.openpi.client import OpenpiLink
from robotd.link.openpi.errors import (
    ActTimeout,
    BadReply,
    CodecError,
    ConnectionLost,
    RequestError,
    ServerError,
)
from robotd.link.openpi.options import JOINT_SOURCES, TASK
from robotd.link.openpi.request import build_request, parse_reply
from robotd.link.rtc import RtcRefused, rtc_request
from robotd.link.steps import FrameLost, LinkCounters, StepReader
from robotd.link.windows import WindowPlanner, assemble

log = logging.getLogger("robotd.link.openpi")


def openpi_contract(cfg: Config) -> tuple[Observations, Actions | None]:
    """What an openpi act reads and answers: the config's declared contract, or else each
    mapped input's source read at the act's own step."""
    p = cfg.policy
    if p.observations is not None:
        obs = Observations.from_wire(p.observations, "policy.observations")
    else:
        sources = {i.source for i in p.openpi.inputs if i.source != TASK}
        obs = Observations(streams={s: Stream() for s in sorted(sources)})
    actions = Actions.from_wire(p.actions, "policy.actions") if p.actions is not None else None
    return obs, actions


@dataclass(slots=True)
class _Act:
    id: int
    wep: str
    step: int
    prev: int | None
    inputs: dict[str, list[Any]]
    asked: float
    rtc: dict[str, Any] | None = None  # the frozen prefix, at the server's rate


class OpenpiActs:
    """The act path to one openpi server (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        link: OpenpiLink,
        reader: StepReader,
        send_down: Callable[[Any], None],
        *,
        task: Callable[[], str],
        on_lost: Callable[[str], None],
        counters: LinkCounters,
    ) -> None:
        self.cfg = cfg
        self.link = link
        obs, self.actions = openpi_contract(cfg)
        self.planner = WindowPlanner(obs.resolve(cfg.control.hz), cfg.observation_keys)
        self.reader = reader
        self.send_down = send_down
        self.task = task
        self.on_lost = on_lost
        self.counters = counters
        self.limits = ChunkLimits.for_robot(cfg)
        self._prev_act: dict[str, int] = {}
        self._last_text = ""  # the server's last traceback logged in full
        self.tap: FrameTap | None = None  # told the frames each act read (the trace)
        self.stopping = False  # set as the daemon stops: acts cut short are not errors

    def begin(self, ask: Ask) -> _Act | None:
        """Plan the window and read it out of the rings at once (frames are overwritten);
        None when that failed (ActFailed sent)."""
        prev = self._prev_act.get(ask.wep)
        try:
            window = self.planner.plan(ask.s, prev)
            inputs = assemble(window, lambda s, k: self.reader.value(ask.wep, s, k))
            rtc = None
            if self.cfg.policy.openpi.rtc is not None:
                rtc = rtc_request(ask.rtc, self.actions, self.cfg.control.hz, self.limits.dim)
        except RtcRefused as exc:
            self._fail(ask.id, f"cannot prepare the act: {exc}")
            return None
        except (ValueError, FrameLost) as exc:
            self.counters.skipped_frames += isinstance(exc, FrameLost)
            self._fail(ask.id, f"window incomplete: {exc}")
            return None
        self._prev_act[ask.wep] = ask.s
        tap_window(self.tap, ask.wep, window, inputs)
        return _Act(ask.id, ask.wep, ask.s, prev, inputs, time.perf_counter(), rtc)

    def warmup_request(self) -> dict[str, Any]:
        """The request an episode's first act sends (its window planned at step 0 with no
        act before it; with [policy.openpi.rtc] in realtime timing, a first act's fields:
        delay 1, nothing queued), keys, shapes and dtypes alike, with neutral contents:
        black frames of each camera's capture size, zero joint values, and no task text
        (a `task` input sends its `default`, as a first act without one does: a prompt is
        tokenized to a fixed length, so its text changes no shape the server compiles).
        RequestError or RtcRefused if the mapping cannot build it."""
        inputs = assemble(self.planner.plan(0, None), lambda _step, key: self._neutral(key))
        rtc = None
        if self.cfg.policy.openpi.rtc is not None and self.cfg.control.timing == "realtime":
            rtc = rtc_request(Rtc(1), self.actions, self.cfg.control.hz, self.limits.dim)
        return build_request(self.cfg.policy.openpi, inputs, "", rtc)

    def _neutral(self, key: str) -> np.ndarray:
        """A key's neutral value, as the step ring or a camera ring holds it."""
        if key in JOINT_SOURCES:
            return np.zeros(len(self.cfg.joints.names))
        cam = self.cfg.cameras[key]
        return np.zeros((cam.height, cam.width, 3), np.uint8)

    async def finish(self, a: _Act) -> None:
        """Act and send the chunk (or act_failed) down; never raises. An act asked during
        the link's warm-up waits for it first; its round trip is timed from then."""
        p = self.cfg.policy
        held = time.perf_counter()
        await self.link.warmup.wait()
        a.asked += time.perf_counter() - held  # the warm-up's time is not the act's
        try:
            request = build_request(p.openpi, a.inputs, self.task(), a.rtc)
            reply = await self.link.act(request, timeout_s=p.timeout_s)
            answer = parse_reply(p.openpi.actions, reply, len(self.cfg.joints.names))
            rows = prepare(answer.rows, self.actions, self.cfg.control.hz, self.limits)
        except (ServerError, ConnectionLost, ActTimeout) as exc:
            self._settle(a)
            self._log_server_text(a.step, getattr(exc, "text", "") or "")
            self.on_lost(f"{type(exc).__name__}: {exc.message}")
            return
        except (BadReply, RequestError, CodecError, ChunkRefused) as exc:
            self._settle(a)
            self._fail(a.id, f"act failed: {type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # a bug must not leave the ask unanswered
            log.exception("ask %d at step %d: the openpi act failed", a.id, a.step)
            self._settle(a)
            self._fail(a.id, f"act failed: {type(exc).__name__}: {exc}")
            return
        self.counters.acts += 1
        self.counters.rtt_ms.add((time.perf_counter() - a.asked) * 1e3)
        if answer.infer_ms is not None:
            self.counters.infer_ms.add(answer.infer_ms)
        self.send_down(ChunkRows(a.id, a.wep, a.step, Rows.of(rows)))

    def _log_server_text(self, step: int, text: str) -> None:
        """The server's traceback in full the first time; a failure that repeats it (a
        config mistake fails every act, reconnect after reconnect) is one line."""
        if not text:
            return
        if text == self._last_text:
            log.error("openpi server failed the act at step %d (the same traceback)", step)
            return
        self._last_text = text
        log.error("openpi server failed the act at step %d:\n%s", step, text[:4000])

    def _settle(self, a: _Act) -> None:
        """An act that got no answer: the next window counts from the act before it."""
        if self._prev_act.get(a.wep) == a.step:
            if a.prev is None:
                self._prev_act.pop(a.wep, None)
            else:
                self._prev_act[a.wep] = a.prev

    def _fail(self, ask_id: int, reason: str) -> None:
        fail_ask(self.counters, self.send_down, ask_id, reason, stopping=self.stopping)

    def forget(self, wep: str) -> None:
        self._prev_act.pop(wep, None)
