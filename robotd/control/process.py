"""The control process: the realtime lane.

One loop thread, absolute deadlines (robotd.control.ticker), SCHED_FIFO and
mlockall when permitted, gc frozen after start-up. Per tick: drain the inbound
socket (commands, chunks) → read the joints → take each camera's newest frame
reference → kernel.update → write the joints → publish what the kernel emitted.
Outbound sends never block: a full queue counts a drop and the loop goes on.

Started by the main process as ``python -m robotd.control.process '<json>'``; the
json carries the validated config and the endpoints/shared-memory names to use.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any

import numpy as np
import zmq

from drivers.base import DriverContext, DriverFault, JointDriver, build_joints
from robotd import wire
from robotd.config import Config
from robotd.control.episode import CommandRefused
from robotd.control.histogram import LatencyHistogram
from robotd.control.kernel import Chunk, Kernel
from robotd.control.rt import enable_realtime, freeze_gc
from robotd.control.ticker import OverrunLog, RateLimiter, Ticker
from robotd.procutil import die_with_parent, install_stop_signals
from robotd.shm import FrameRing

log = logging.getLogger("robotd.control")

MAX_INBOUND_PER_TICK = 32


def open_joint_driver(cfg: Config, shm_prefix: str | None) -> JointDriver:
    """Build the configured joint driver through the factory and open it."""
    context = DriverContext(shm_prefix=shm_prefix)
    driver = build_joints(cfg.joints.driver, cfg.joints.names, cfg.joints.options, context)
    driver.open()
    return driver


class ControlLane:
    """Owns the sockets, the driver, the rings and the kernel; runs the loop thread."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.cfg = Config.model_validate(spec["config"])
        self.spec = spec
        ctx = zmq.Context.instance()
        self.up = ctx.socket(zmq.PUSH)
        self.up.setsockopt(zmq.SNDHWM, 10_000)
        self.up.setsockopt(zmq.LINGER, 500)
        self.up.connect(spec["up"])
        self.down = ctx.socket(zmq.PULL)
        self.down.setsockopt(zmq.LINGER, 0)
        self.down.bind(spec["down"])
        if spec["down"].startswith("ipc://"):
            os.chmod(spec["down"].removeprefix("ipc://"), 0o660)
        self.dropped = 0
        self.kernel = Kernel(self.cfg, run_id=spec["run_id"], emit=self._send)
        self.driver = open_joint_driver(self.cfg, spec.get("shm_prefix"))
        self.rings = {
            name: FrameRing.attach(ring, pixels=False)
            for name, ring in spec.get("rings", {}).items()
        }
        self.has_truth = bool(self.driver.ground_truth())
        self.hist = LatencyHistogram()  # lateness at the deadline (after the spin tail)
        self.wake_hist = LatencyHistogram()  # lateness of the sleep's wake-up (before the spin)
        self.ticker = Ticker.from_hz(self.cfg.control.hz, spin_ns=self.cfg.control.spin_us * 1000)
        self.stop = threading.Event()
        # Start holding where the joints are (the driver anchors its target on torque on).
        self.driver.torque(True)
        self.torque = True
        self.warnings: list[str] = []
        self._error_log = RateLimiter(200_000_000)  # at most 5 error events a second
        self.died = False

    # ---- messaging -------------------------------------------------------------------------

    def _send(self, msg: dict[str, Any]) -> None:
        try:
            self.up.send(wire.packb(msg), zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1

    def _drain(self) -> None:
        for _ in range(MAX_INBOUND_PER_TICK):
            try:
                data = self.down.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = wire.unpackb(data)
                self._handle(msg)
            except Exception as exc:  # a bad message must never stop the lane
                self._send({"k": "event", "name": "bad_message", "error": str(exc)[:300]})

    def _handle(self, msg: Any) -> None:
        if not isinstance(msg, dict):
            raise ValueError(f"inbound message must be a map, got {type(msg).__name__}")
        kind = msg.get("k")
        if kind == "chunk":
            rows = msg["rows"]
            if not isinstance(rows, np.ndarray):
                rows = np.asarray(rows, dtype=np.float64)
            self.kernel.deliver(
                Chunk(
                    int(msg["ask"]),
                    str(msg["wep"]),
                    int(msg["s"]),
                    rows.astype(np.float64, copy=False),
                )
            )
        elif kind == "cmd":
            rid = msg.get("id")
            try:
                result = self.kernel.command(str(msg["cmd"]), msg.get("args") or {})
                self._send({"k": "reply", "id": rid, "ok": True, "result": result})
            except CommandRefused as exc:
                self._send(
                    {
                        "k": "reply",
                        "id": rid,
                        "ok": False,
                        "error": {"code": exc.code, "message": str(exc)},
                    }
                )
            self._send({"k": "state", **self.kernel.status()})
        elif kind == "act_failed":
            self.kernel.act_failed(int(msg["ask"]), str(msg.get("reason", "")))
        elif kind == "episode_lost":
            self.kernel.episode_lost(str(msg.get("cause", "unknown")))
        elif kind == "contract":
            olh = msg.get("open_loop_horizon")
            self.kernel.set_contract(None if olh is None else int(olh))
        elif kind == "stop":
            self.stop.set()
        else:
            raise ValueError(f"unknown inbound message kind {kind!r}")

    # ---- the loop --------------------------------------------------------------------------

    def _stats(self) -> None:
        self._send(
            {
                "k": "stats",
                **self.kernel.stats(),
                "missed_ticks": self.ticker.missed,
                "elapsed_s": (time.monotonic_ns() - self.ticker.origin_ns) / 1e9,
                "overruns": self.ticker.overruns,
                "dropped_messages": self.dropped,
                "lateness": self.hist.to_wire(),
                "wake_lateness": self.wake_hist.to_wire(),
                "state": self.kernel.status(),
                "driver": self.driver.stats().to_wire(),
            }
        )

    def _driver_error(self, what: str, exc: Exception) -> None:
        # Any exception from a driver (not only DriverFault: a serial OSError, a bug in a
        # plugin) is a failed operation this tick, never the end of the loop.
        if self._error_log.allow(time.monotonic_ns()):
            joint = getattr(exc, "joint", None)
            self._send(
                {
                    "k": "event",
                    "name": "driver_error",
                    "op": what,
                    "error": f"{type(exc).__name__}: {exc}",
                    "joint": joint,
                }
            )

    def _tick_io(self, skipped: int) -> None:
        try:
            joints = self.driver.read()
        except Exception as exc:
            joints = None
            self._driver_error("read", exc)
        frames = {name: ring.latest() for name, ring in self.rings.items()}
        truth = None
        if self.has_truth and joints is not None:
            try:
                truth = self.driver.ground_truth()
            except Exception as exc:
                self._driver_error("ground_truth", exc)
        try:
            target = self.kernel.update(time.monotonic_ns(), joints, frames, truth, skipped)
        except Exception as exc:  # a kernel bug: hold the last approved target, say so
            target = self.kernel.shield.last if self.kernel.torque_on else None
            if self._error_log.allow(time.monotonic_ns()):
                log.exception("kernel.update failed")
                self._send({"k": "event", "name": "kernel_error", "error": repr(exc)[:300]})
        if self.kernel.torque_on != self.torque:
            try:
                self.driver.torque(self.kernel.torque_on)
                self.torque = self.kernel.torque_on
            except Exception as exc:
                self._driver_error("torque", exc)
        if target is not None:
            try:
                self.driver.write(target)
            except Exception as exc:
                self._driver_error("write", exc)

    def run(self) -> None:
        """The loop thread's body: returns when `stop` is set, the robot holding."""
        self.warnings = enable_realtime(self.cfg.control.rt_priority, self.cfg.control.lock_memory)
        for w in self.warnings:
            self._send({"k": "event", "name": "rt_warning", "detail": w})
        stats_every = max(1, round(self.cfg.control.stats_interval_s * self.cfg.control.hz))
        overruns = OverrunLog()
        freeze_gc()
        self.ticker.start()
        first = True
        while not self.stop.is_set():
            tick = self.ticker.wait()
            self.hist.add(tick.lateness_ns)
            if tick.sleep_lateness_ns is not None:
                self.wake_hist.add(max(0, tick.sleep_lateness_ns))
            if tick.overrun:
                report = overruns.record(tick.woke_ns, tick.lateness_ns // self.ticker.period_ns)
                if report is not None:
                    self._send(
                        {
                            "k": "event",
                            "name": "overrun",
                            "overruns": report[0],
                            "skipped": report[1],
                        }
                    )
            self._drain()
            self._tick_io(tick.skipped)
            if first:
                self._send({"k": "ready", "pid": os.getpid(), "warnings": self.warnings})
                first = False
            if tick.index % stats_every == 0:
                self._stats()
        self._stats()
        self._send({"k": "bye"})

    def run_guarded(self) -> None:
        try:
            self.run()
        except BaseException as exc:
            self.died = True
            log.exception("control loop died")
            self._send({"k": "event", "name": "loop_died", "error": repr(exc)[:300]})
            raise
        finally:
            self.stop.set()

    def close(self) -> None:
        try:
            self.driver.close()
        finally:
            for ring in self.rings.values():
                ring.close()
            self.up.close()
            self.down.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="control: %(message)s")
    die_with_parent()
    stop = install_stop_signals()
    try:
        spec = json.loads(argv[0])
        lane = ControlLane(spec)
    except (IndexError, ValueError, KeyError) as exc:
        print(f"robotd control: bad start-up spec: {exc}", file=sys.stderr)
        return 2
    except DriverFault as exc:
        print(f"robotd control: joint driver failed to open: {exc}", file=sys.stderr)
        return 3
    lane.stop = stop  # a signal and an inbound "stop" end the loop the same way
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
