"""The control process: the realtime lane.

One loop thread, absolute deadlines (robotd.control.ticker), SCHED_FIFO and mlockall when
permitted, gc frozen after start-up. Per tick (`ControlLane.one_tick`): take e-stops off
lane.sock first → drain the private inbound socket (chunks, commands) → the tick
(robotd.control.tick: read → frame refs → kernel.update → write) → send what the kernel
emitted, as one multipart message. Sends never block: a full queue counts a drop and the
loop goes on. Every inbound message is decoded and validated (robotd.lane.codec); a bad
one becomes a counted, rate-limited `bad_message` event, never an exception in the loop.

Started by the main process as ``python -m robotd.control.process '<json>'``; the json
(`ControlSpec`) carries the validated config and the endpoints/shared-memory names.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import zmq

from drivers.base import DriverContext, DriverFault, JointDriver, build_joints
from robotd.config import Config
from robotd.config.sections import CAMERA_DRIVERS
from robotd.control.episode import CommandRefused
from robotd.control.estop import EstopDesk, written_reply
from robotd.control.histogram import LatencyHistogram
from robotd.control.kernel import Kernel
from robotd.control.mainwatch import MainWatch
from robotd.control.playback import Chunk
from robotd.control.ports import ORPHAN_WRITE_S, ControlSpec, LanePorts  # noqa: F401 (tests)
from robotd.control.rt import enable_realtime, freeze_gc, small_thread_stacks
from robotd.control.tick import TickIO
from robotd.control.ticker import OverrunLog, RateLimiter, Tick, Ticker
from robotd.lane import codec
from robotd.lane.messages import (
    ActFailed,
    Beat,
    Bye,
    ChunkRows,
    Command,
    Contract,
    EpisodeLost,
    Event,
    Ready,
    Reply,
    Shutdown,
    Stats,
)
from robotd.runtime.procutil import (
    die_with_parent,
    install_stop_signals,
    line_start,
    signal_event,
)
from robotd.shm import FrameRing, unlink_prefix

log = logging.getLogger("robotd.control")

MAX_INBOUND_PER_TICK = 32
BEAT = codec.encode(Beat())  # the main process's beat: known by its bytes, not decoded


def open_joint_driver(cfg: Config, context: DriverContext) -> JointDriver:
    """Build the configured joint driver through the factory and open it."""
    driver = build_joints(cfg.joints.driver, cfg.joints.names, cfg.joints.options, context)
    driver.open()
    return driver


class ControlLane:
    """Owns the ports, the driver, the rings and the kernel; `run` is the loop thread."""

    def __init__(
        self,
        spec: ControlSpec,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        """`sleep`: the loop's sleep between ticks (default: one that takes e-stops at once,
        EstopDesk.sleep); tests hand a fake clock and sleep."""
        # checked by the main process at load; its cameras are not the lane's to run
        self.cfg = Config.model_validate(spec.config, context={CAMERA_DRIVERS: False})
        self.ports = LanePorts(spec)
        self.clock = clock
        self.dropped = 0  # messages dropped because main's queue was full
        self.sent = 0  # batches sent (one per tick that emitted anything)
        self.outbox: list[Any] = []
        self.kernel = Kernel(self.cfg, run_id=spec.run_id, emit=self.outbox.append)
        self.warnings_at_start: list[str] = []  # the driver's warnings at open among them
        self._first = True  # no tick yet (Ready not sent)
        self._warn_log = RateLimiter(200_000_000)  # a driver's warnings once ticking: 5 a second
        self.driver = open_joint_driver(
            self.cfg,
            DriverContext(
                clock=clock,
                shm_prefix=spec.shm_prefix,
                config_dir=Path(spec.config_dir) if spec.config_dir else None,
                warn=self._driver_warned,
            ),
        )
        # The lane reads only each ring's index (the newest frame's reference), never pixels.
        self.rings = {n: FrameRing.attach(r, pixels=False) for n, r in spec.rings.items()}
        self.io = TickIO(self.kernel, self.driver, self._frames, self._driver_error, clock)
        self.hist = LatencyHistogram()  # lateness at the deadline (after the spin tail)
        self.wake_hist = LatencyHistogram()  # lateness of the sleep's wake-up (before the spin)
        c = self.cfg.control
        self.estops = EstopDesk(
            self.ports.estop,
            self.kernel,
            safe_now=self.io.safe_now,
            failed=lambda: self.io.failed,
            bad=self._bad,
            flush=self.flush,
        )
        sleep = sleep or self.estops.sleep
        self.ticker = Ticker.from_hz(c.hz, spin_ns=c.spin_us * 1000, clock=clock, sleep=sleep)
        self.stats_every = max(1, round(c.stats_interval_s * c.hz))
        self.stop = threading.Event()
        self.warnings: list[str] = []
        self._error_log = RateLimiter(200_000_000)  # at most 5 error events a second
        self._bad_log = RateLimiter(1_000_000_000)
        self._overruns = OverrunLog()
        self.spec = spec
        self.orphaned = threading.Event()  # set when the main process is gone (PDEATHSIG)
        self.main = MainWatch(self.kernel, self.io, c.orphan_s, c.main_silent_s, self.stop)
        self._estops_to_answer: list[int | None] = []  # main's e-stops, answered once written
        self.died = False
        self.io.start()

    # ---- inbound ---------------------------------------------------------------------------

    def _frames(self) -> dict[str, tuple[int, int] | None]:
        return {name: ring.latest() for name, ring in self.rings.items()}

    def drain(self) -> None:
        """E-stops first (lane.sock), then the private inbound socket, bounded per tick."""
        self.estops.drain()
        down = self.ports.down
        for _ in range(MAX_INBOUND_PER_TICK if down.getsockopt(zmq.EVENTS) & zmq.POLLIN else 0):
            try:
                data = down.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.main.heard(self.clock(), data == BEAT)
            try:
                self._handle(codec.decode_down(data))
            except codec.LaneError as exc:
                self._bad("bad_message", str(exc))
            except Exception as exc:  # a bug must never stop the lane
                self._bad("lane_error", f"{type(exc).__name__}: {exc}")

    def _handle(self, msg: Any) -> None:
        k = self.kernel
        if isinstance(msg, ChunkRows):
            try:
                rows = msg.rows.array()
            except ValueError as exc:
                self._bad("bad_message", f"chunk for ask {msg.ask}: {exc}")
                return
            k.deliver(Chunk(msg.ask, msg.wep, msg.s, rows))
        elif isinstance(msg, Command):
            try:
                status = k.command(
                    msg.cmd, msg.reason, msg.task, msg.sent_ns,
                    expires_ns=msg.expires_ns, now_ns=time.monotonic_ns(),
                )  # fmt: skip
                if msg.cmd == "estop":  # answered after this tick's write: written or not
                    self._estops_to_answer.append(msg.id)
                else:
                    self.outbox.append(Reply(msg.id, True, status))
            except CommandRefused as exc:
                self.outbox.append(Reply(msg.id, False, k.status(), exc.code, str(exc)))
        elif isinstance(msg, ActFailed):
            k.act_failed(msg.ask, msg.reason)
        elif isinstance(msg, EpisodeLost):
            k.episode_lost(msg.cause)
        elif isinstance(msg, Contract):
            k.set_contract(msg.open_loop_horizon, msg.rtc, msg.ready)
        elif isinstance(msg, Shutdown):
            self.stop.set()

    def _bad(self, name: str, error: str) -> None:
        self.kernel.counters.bad_messages += 1
        if self._bad_log.allow(self.clock()):
            count = self.kernel.counters.bad_messages
            self.outbox.append(
                Event(name, self.kernel.counters.ticks, {"error": error[:300], "count": count})
            )

    # ---- outbound --------------------------------------------------------------------------

    def flush(self) -> None:
        """Send what this tick emitted as one message (a msgpack array of them); a full
        queue drops it, counted."""
        if not self.outbox:
            return
        data = codec.encode_batch(self.outbox)
        n = len(self.outbox)
        self.outbox.clear()
        try:
            self.ports.up.send(data, zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += n

    def stats(self) -> Stats:
        k = self.kernel
        lat = k.playback.ask_latency
        return Stats(
            k.counters,
            k.playback.queue.counters,
            k.shield.counters,
            self.hist.data(),
            self.wake_hist.data(),
            dict(lat.steps),
            lat.ns.data(),
            self.ticker.missed,
            self.ticker.overruns,
            (self.clock() - self.ticker.origin_ns) / 1e9,
            self.dropped,
            self.driver.stats().to_wire(),
            k.status(),
        )

    def _driver_warned(self, text: str) -> None:
        """A driver's warning: said with Ready before the first tick, as an event after
        (a servo that stopped by itself, a condition it reports), never kept."""
        if self._first:
            if len(self.warnings_at_start) < 100:
                self.warnings_at_start.append(text[:300])
        elif self._warn_log.allow(self.clock()):
            detail = {"warning": text[:300]}
            self.outbox.append(Event("driver_warning", self.kernel.counters.ticks, detail))

    def _driver_error(self, op: str, exc: BaseException) -> None:
        if op == "kernel":
            log.exception("kernel.update failed", exc_info=exc)
        if self._error_log.allow(self.clock()):
            detail = {"op": op, "error": f"{type(exc).__name__}: {exc}"[:300]}
            detail["joint"] = getattr(exc, "joint", None)
            name = "kernel_error" if op == "kernel" else "driver_error"
            self.outbox.append(Event(name, self.kernel.counters.ticks, detail))

    # ---- the loop --------------------------------------------------------------------------

    def one_tick(self, tick: Tick) -> None:
        """Everything the loop does at one deadline."""
        self.hist.add(tick.lateness_ns)
        if tick.sleep_lateness_ns is not None:
            self.wake_hist.add(max(0, tick.sleep_lateness_ns))
        if tick.overrun:
            report = self._overruns.record(tick.woke_ns, tick.lateness_ns // self.ticker.period_ns)
            if report is not None:
                detail = {"overruns": report[0], "skipped": report[1]}
                self.outbox.append(Event("overrun", self.kernel.counters.ticks, detail))
        self.drain()
        self.main.tick(tick.woke_ns, self.orphaned.is_set())
        self.io.run(tick.woke_ns, tick.skipped)
        if self.estops.pending:
            self.estops.ack(self.io.done_ns)
        for rid in self._estops_to_answer:
            status = self.kernel.status()
            self.outbox.append(written_reply(rid, status, self.io.done_ns, self.io.failed))
        self._estops_to_answer.clear()
        if self._first:
            self.outbox.append(Ready(os.getpid(), self.warnings))
            self._first = False
        if tick.index % self.stats_every == 0:
            self.outbox.append(self.stats())
        self.flush()

    def run(self) -> None:
        """The loop thread's body: returns when `stop` is set, the robot holding."""
        c = self.cfg.control
        self.warnings = self.warnings_at_start + enable_realtime(c.rt_priority, c.lock_memory)
        freeze_gc()
        self.ticker.start()
        while not self.stop.is_set():
            self.one_tick(self.ticker.wait())
        self.outbox.append(self.stats())
        self.outbox.append(Bye())
        self.flush()

    def run_guarded(self) -> None:
        try:
            self.run()
        except BaseException as exc:
            self.died = True
            log.exception("control loop died")
            detail = {"error": repr(exc)[:300]}
            self.outbox.append(Event("loop_died", self.kernel.counters.ticks, detail))
            self.flush()
            raise
        finally:
            self.stop.set()

    def close(self) -> None:
        try:
            self.driver.close()
        finally:
            for ring in self.rings.values():
                ring.close()
            self.ports.close()
            if self.orphaned.is_set():
                self._clean_after_main()

    def _clean_after_main(self) -> None:
        """Nobody else is left to remove what this run made: its shared memory (the rings,
        the drivers' own segments) and the lane's socket files."""
        if self.spec.shm_prefix:
            unlink_prefix(self.spec.shm_prefix)
        rt = self.cfg.runtime
        run_dir = os.path.dirname(self.spec.estop.removeprefix("ipc://"))
        operator = [
            rt.control_endpoint or f"ipc://{run_dir}/control.sock",
            rt.telemetry_endpoint or f"ipc://{run_dir}/telemetry.sock",
        ]
        for ep in (self.spec.down, self.spec.estop, self.spec.up, *operator):
            if ep.startswith("ipc://"):
                with contextlib.suppress(OSError):
                    os.unlink(ep.removeprefix("ipc://"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # as the daemon's own lines (time, level), the process named: journal lines interleave
    fmt = line_start() + "%(asctime)s %(levelname)s control: %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt)
    stacks = small_thread_stacks()  # before any thread starts (signals, ZeroMQ, the loop)
    stop = install_stop_signals()
    # The main process's death is not a stop: the lane holds, then e-stops (MainWatch).
    orphaned = signal_event((signal.SIGUSR2,))
    die_with_parent(sig=signal.SIGUSR2)
    try:
        spec = msgspec.json.decode(argv[0], type=ControlSpec)
        lane = ControlLane(spec)
    except (IndexError, ValueError, KeyError, msgspec.MsgspecError) as exc:
        print(f"robotd control: bad start-up spec: {exc}", file=sys.stderr)
        return 2
    except DriverFault as exc:
        print(f"robotd control: joint driver failed to open: {exc}", file=sys.stderr)
        return 3
    lane.stop = lane.main.stop = stop  # a signal and an inbound Shutdown end the loop alike
    lane.orphaned = orphaned
    if stacks:
        lane.warnings_at_start.append(stacks)
    thread = threading.Thread(target=lane.run_guarded, name="control-loop", daemon=True)
    thread.start()
    stop.wait()
    thread.join(timeout=5.0)
    if thread.is_alive():
        # The loop is stuck inside a driver call: leave its sockets and driver to the exit.
        print("robotd control: the loop thread did not stop within 5 s", file=sys.stderr)
        return 1
    lane.close()
    return 1 if lane.died else 0


if __name__ == "__main__":
    sys.exit(main())
