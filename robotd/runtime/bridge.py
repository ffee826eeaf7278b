"""The main process's end of the lane (anyio): send down, receive up, match replies.

Three sockets in the run directory:
- up (main binds, 0600): everything the control lane emits, a tick's messages per
  multipart message; each frame decoded and dispatched to the handler of its type;
- down (the control process binds, 0600): chunks, commands and the rest, NOBLOCK;
- lane.sock (the control process binds, 0660): e-stops, served first by the lane at
  every tick, so a burst of other commands never delays one.

Beside the messages it keeps when the lane's ticks were (LaneClock: the log says when the
lane took an event this process read late), tells StaleCameras the lane's state at each
Stats, and says once when this process itself did not run for MAIN_STALL_S or more.

Commands are bounded: at most MAX_PENDING wait for their reply at once; beyond that the
caller gets `LaneBusy` at once (the operator's reply says "busy") instead of a queue that
would delay everything behind it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import zmq
import zmq.asyncio

from robotd.lane import codec
from robotd.lane.messages import Beat, Bye, Command, Estop, Ready, Reply, Stats, Status, Step
from robotd.operator.words import state_words
from robotd.runtime.events import StaleCameras
from robotd.runtime.rundir import remove_socket_file
from robotd.runtime.view import SILENT_MIN_S, LaneClock, LaneSilence, status_dict

log = logging.getLogger("robotd")

MAX_PENDING = 64  # commands waiting for the control lane's reply
# Woken this much later than asked, the main process itself did not run (SIGSTOP, a
# debugger, starved of CPU): said once, as the e-stops and faults the lane took meanwhile
# are only read now. Far over any scheduling hiccup of a loaded 2-core machine.
MAIN_STALL_S = 2.0
STALL_BEAT_S = 0.1  # how often the stall watch wakes: the stall it reports is this exact
# How often the lane is told this process lives (Beat): well under control.main_silent_s
# (at least 0.5 s), after which the lane holds and then e-stops.
BEAT_S = 0.2
_BEAT = codec.encode(Beat())


class LaneBusy(RuntimeError):
    """Too many commands already wait for the control lane."""


def lane_endpoint(run_dir: Path) -> str:
    """lane.sock: the control lane's e-stop socket, at a fixed name so that `robotctl
    estop` reaches it when the main process does not answer."""
    return f"ipc://{run_dir}/lane.sock"


class LaneBridge:
    """Owns the main side's lane sockets. `on(type, handler)` registers what to do with
    each kind of up message; `run()` receives until cancelled."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        run_dir: Path,
        *,
        silent_after_s: float = SILENT_MIN_S,
        hz: float = 30.0,
        cameras: StaleCameras | None = None,
    ) -> None:
        """`hz`: the lane's control rate (its ticks' times, `clock`); `cameras`: told the
        lane's state at each Stats, to say when a camera goes stale and fresh again."""
        pid = os.getpid()
        self.up_ep = f"ipc://{run_dir}/up-{pid}.sock"
        self.down_ep = f"ipc://{run_dir}/lane-{pid}.sock"
        self.estop_ep = lane_endpoint(run_dir)
        self.up = ctx.socket(zmq.PULL)
        self.up.setsockopt(zmq.LINGER, 0)
        self.up.setsockopt(zmq.MAXMSGSIZE, codec.MAX_MESSAGE_BYTES)
        self.down = ctx.socket(zmq.PUSH)
        self.down.setsockopt(zmq.LINGER, 1000)
        self.down.setsockopt(zmq.SNDHWM, 1000)
        self.estop_sock = ctx.socket(zmq.DEALER)
        self.estop_sock.setsockopt(zmq.LINGER, 0)
        self._handlers: dict[type, Callable[[Any], None]] = {}
        self._pending: dict[int, tuple[anyio.Event, list[Reply]]] = {}
        self._given_up: dict[int, str] = {}  # commands answered `timeout`: id -> command
        self._next_id = 0
        self._estop_lock = anyio.Lock()
        self.status: Status | None = None  # the lane's latest word on its state
        self.dropped = 0  # down messages dropped because the lane's inbound queue was full
        self.bad = 0  # up frames that did not decode
        self.tap: Callable[[Any], None] | None = None  # told each message sent down (the trace)
        # When the lane last spoke: `status` is only a cache of its last word (robotd.runtime.view).
        self.silence = LaneSilence(silent_after_s)
        self.lane_pid: int | None = None  # from its Ready, for the silence warning
        self.lane_said_bye = False  # it stopped on purpose: its silence is no news
        self.clock = LaneClock(hz)  # when the lane's ticks were (its events carry ticks)
        self.cameras = cameras
        self.last_step: Step | None = None  # the newest Step read (its frames' times)
        self._connected = False  # down is connected: beats may go
        self.beats_dropped = 0  # the lane's inbound queue full (the lane stopped): no news

    def on(self, kind: type, handler: Callable[[Any], None]) -> None:
        self._handlers[kind] = handler

    def bind(self) -> None:
        """Bind the up socket (before the control process starts: it connects to it)."""
        old = os.umask(0o177)
        try:
            self.up.bind(self.up_ep)
        finally:
            os.umask(old)

    def connect(self) -> None:
        """Connect down and lane.sock (the control process binds them)."""
        self.down.connect(self.down_ep)
        self.estop_sock.connect(self.estop_ep)
        self._connected = True

    # ---- down ----------------------------------------------------------------------------

    def send(self, msg: Any) -> bool:
        """Send one message down without waiting; False (logged) when the queue is full."""
        if not self._push(codec.encode(msg)):
            self.dropped += 1
            log.error("control lane inbound queue full: dropped %s", type(msg).__name__)
            return False
        if self.tap is not None:
            try:
                self.tap(msg)
            except Exception:  # the trace's trouble is never the lane's
                log.exception("the lane's tap failed on %s", type(msg).__name__)
        return True

    def _push(self, data: bytes) -> bool:
        """Send on down now; False when its queue is full. An asyncio socket's NOBLOCK send
        puts zmq.Again on the future it returns rather than raising it (done at once, as
        no send ever waits here): read there, or the drop would go uncounted."""
        fut = self.down.send(data, zmq.NOBLOCK)
        if not fut.done():
            return True
        try:
            fut.result()
        except zmq.Again:
            return False
        return True

    async def command(
        self,
        cmd: str,
        *,
        reason: str = "",
        task: str = "",
        timeout_s: float = 5.0,
        sent_ns: int | None = None,
        expires_ns: int = 0,
    ) -> Reply:
        """An operator command and the lane's reply; TimeoutError, or LaneBusy at once when
        MAX_PENDING commands already wait. The e-stop goes through `estop` instead.
        `sent_ns`: when the request was taken (None: now); the lane orders it against
        e-stops by it. `expires_ns`: when its client stops waiting (0: never), past which
        the lane refuses a command that would move the robot again."""
        sent_ns = sent_ns or time.monotonic_ns()
        # past our own wait the operator is answered `timeout`: the command must not act later
        ours = time.monotonic_ns() + round(timeout_s * 1e9)
        expires_ns = min(expires_ns, ours) if expires_ns else ours
        if cmd == "estop":
            return await self.estop(reason, timeout_s=timeout_s, sent_ns=sent_ns)
        if len(self._pending) >= MAX_PENDING:
            raise LaneBusy(f"{MAX_PENDING} commands already wait for the control lane")
        self._next_id += 1
        rid = self._next_id
        done, box = anyio.Event(), []
        self._pending[rid] = (done, box)
        try:
            msg = Command(
                rid, cmd, reason=reason, task=task, sent_ns=sent_ns, expires_ns=expires_ns
            )  # type: ignore[arg-type]
            if not self.send(msg):
                raise LaneBusy("the control lane's inbound queue is full")
            with anyio.fail_after(timeout_s):
                await done.wait()
        except TimeoutError:
            self._given_up[rid] = cmd  # its answer, if it comes, is logged: what became of it
            while len(self._given_up) > MAX_PENDING:
                del self._given_up[next(iter(self._given_up))]
            raise TimeoutError(
                f"the control lane did not answer {cmd!r} within {timeout_s} s"
            ) from None
        finally:
            self._pending.pop(rid, None)
        return box[0]

    async def estop(
        self, reason: str, *, timeout_s: float = 5.0, sent_ns: int | None = None
    ) -> Reply:
        """An e-stop on lane.sock (served first by the lane) and its acknowledgement. It is
        stamped when taken, before any wait for the lock: a command taken before it and
        still on its way (the lane takes lane.sock first) is then refused, not carried out
        after it."""
        sent_ns = sent_ns or time.monotonic_ns()
        async with self._estop_lock:
            self._next_id += 1
            rid = self._next_id
            await self.estop_sock.send(codec.encode(Estop(rid, reason[:500], sent_ns)))
            try:
                with anyio.fail_after(timeout_s):
                    return await self._estop_reply(rid)
            except TimeoutError:
                raise TimeoutError(
                    f"the control lane did not acknowledge the e-stop within {timeout_s:g} s "
                    "(stopped or hung?): it is latched once the lane reads lane.sock"
                ) from None

    async def _estop_reply(self, rid: int) -> Reply:
        while True:
            data = await self.estop_sock.recv()
            try:
                reply = codec.decode_up(data)
            except codec.LaneError:
                continue
            if isinstance(reply, Reply) and reply.id == rid:
                self._said(reply.status)
                return reply

    # ---- up ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Receive and dispatch until cancelled; a bad frame is counted and logged, a handler
        that raises is logged with its traceback, and the loop goes on. Beside it, a watch
        on the lane's silence (`_watch_silence`)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_silence)
            tg.start_soon(self._watch_own_stall)
            tg.start_soon(self._beat)
            await self._receive()

    async def _beat(self) -> None:
        """Tell the lane this process lives, every BEAT_S from the event loop itself: a
        process stopped or an event loop blocked stops beating, and the lane notices
        (robotd.control.mainwatch). Never through `send`: no trace, and a full queue (a
        stopped lane, which the silence watch reports) is counted, not logged each time."""
        while True:
            if self._connected and not self._push(_BEAT):
                self.beats_dropped += 1
            await anyio.sleep(BEAT_S)

    async def _receive(self) -> None:
        while True:
            data = await self.up.recv(copy=False)
            self._heard()  # any frame, even one that does not decode: the lane is alive
            try:
                batch = codec.decode_up_batch(data.buffer)
            except codec.LaneError as exc:
                self.bad += 1
                log.error("bad message from the control lane: %s", exc)
                continue
            for msg in batch:
                try:
                    self._dispatch(msg)
                except Exception:
                    log.exception("handling %s from the control lane", type(msg).__name__)

    def _heard(self) -> None:
        ended = self.silence.heard()
        if ended is not None:
            # A warning, like the silence: `journalctl -p warning` shows both ends of it.
            log.warning("control lane speaks again after %.1f s of silence", ended)

    def _unread(self) -> bool:
        """Up messages wait unread: the lane spoke and the main process is what lags."""
        try:
            return bool(self.up.get(zmq.EVENTS) & zmq.POLLIN)
        except zmq.ZMQError:  # closed: nothing waits
            return False

    def lane_age(self) -> dict[str, Any]:
        """How long ago the lane last spoke and whether that is a silence (the view's)."""
        return self.silence.reading(self._unread())

    async def _watch_own_stall(self) -> None:
        """Say once per stall when this process did not run for MAIN_STALL_S or more (its
        own sleep of STALL_BEAT_S woke that much late): what the lane did meanwhile is read
        only now. Its own short beat, so the length said is within STALL_BEAT_S of the
        truth (the silence watch wakes a quarter of its bound apart: too coarse)."""
        clock = self.silence.clock
        woke = clock()
        while True:
            await anyio.sleep(STALL_BEAT_S)
            now = clock()
            late, woke = now - woke - STALL_BEAT_S, now
            if late >= MAIN_STALL_S:
                log.warning(
                    "the main process was not running for %.1f s (stopped or starved of "
                    "CPU): what the control lane did meanwhile is read only now",
                    late,
                )

    async def _watch_silence(self) -> None:
        """Warn once when the lane stays silent past its bound. Nothing else would notice:
        a stopped or hung control process sends nothing, and its last Status would go on
        being served as if live. Checked four times per bound: warned by 1.25 bounds at most."""
        every = self.silence.after_s / 4
        woke = self.silence.clock()
        while True:
            await anyio.sleep(every)
            late, woke = self.silence.clock() - woke - every, self.silence.clock()
            # Woken this late, the main process itself was stopped or starved: the lane's
            # messages may not even have reached our socket yet. Judge it next round.
            if late > every or self.lane_said_bye:
                continue
            age = self.silence.declare(self._unread())
            if age is None:
                continue
            last = state_words(status_dict(self.status)) if self.status else "nothing"
            log.warning(
                "control lane silent for %.1f s: no Stats, Step or reply from it (pid %s: "
                "stopped or hung?), last state %s; status and telemetry say LANE SILENT "
                "until it speaks again",
                age,
                self.lane_pid if self.lane_pid is not None else "?",
                last,
            )

    def _said(self, status: Status | None) -> None:
        """Keep `status` if it is newer than the one held: an e-stop's answer on lane.sock
        can overtake a state the lane said before it, still on the up stream (a status read
        then would show the robot IDLE after its e-stop)."""
        if status is not None and (self.status is None or status.seq > self.status.seq):
            self.status = status

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, Step):  # first: one every tick
            self.last_step = msg
        elif isinstance(msg, Reply):
            self._said(msg.status)
            waiting = self._pending.get(msg.id) if msg.id is not None else None
            if waiting is not None:
                waiting[1].append(msg)
                waiting[0].set()
            elif msg.id is not None and (cmd := self._given_up.pop(msg.id, None)):
                done = "carried out" if msg.ok else f"refused ({msg.code}: {msg.message})"
                log.warning("the control lane answered the %s given up on: %s", cmd, done)
            return
        if isinstance(msg, Status):
            self._said(msg)
        elif isinstance(msg, Stats):
            self._said(msg.state)
            self.clock.stats(msg.counters.ticks, msg.elapsed_s)
            if self.cameras is not None:  # a Stats comes after its tick's Step
                self.cameras.seen(msg.state, self.last_step)
        elif isinstance(msg, Ready):
            self.lane_pid = msg.pid
        elif isinstance(msg, Bye):
            self.lane_said_bye = True
        handler = self._handlers.get(type(msg))
        if handler is not None:
            handler(msg)

    def close(self) -> None:
        for sock in (self.up, self.down, self.estop_sock):
            sock.close(linger=0)
        remove_socket_file(Path(self.up_ep.removeprefix("ipc://")))
