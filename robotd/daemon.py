"""The main process (the async lane): start the other lanes, link them, supervise, stop.

Everything here runs on anyio (uvloop). It creates the shared memory (sim world,
one frame ring per camera), starts the control process, one process per camera
and (unless a remote worker is named) a local policy worker, answers the control
lane's asks through the policy link, serves operators, notifies systemd, and on
SIGINT/SIGTERM or the end of --duration stops everything and writes the summary.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import zmq
import zmq.asyncio

from robotd import sdnotify, wire
from robotd.children import (
    Shared,
    camera_argv,
    control_argv,
    create_shared,
    lane_endpoint,
    worker_argv,
)
from robotd.config import Config, runtime_dir
from robotd.contract import ContractError
from robotd.link.client import Handshake, PolicyClient, PolicyError
from robotd.link.connect import StartupError, connect_policy
from robotd.link.session import ActLink, StepRing
from robotd.link.uplink import Uplink
from robotd.operator.server import OperatorServer
from robotd.status import StatusLine
from robotd.summary import RunSummary
from robotd.supervisor import Child, Supervisor

log = logging.getLogger("robotd")

READY_TIMEOUT_S = 30.0


@dataclass
class Options:
    duration: float | None = None
    summary: Path | None = None
    worker: str | None = None
    status: bool = True


class Daemon:
    """One run of robotd: owns the sockets, the children and the run's counters."""

    def __init__(self, cfg: Config, opts: Options) -> None:
        self.cfg = cfg
        self.opts = opts
        self.run_id = secrets.token_hex(3)
        self.dir = runtime_dir(cfg)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        self._lock = lock_run_dir(self.dir)  # before any socket in it is touched
        pid = os.getpid()
        self.up_ep = f"ipc://{self.dir}/up-{pid}.sock"
        # The lane's inbound socket has a fixed name: `robotctl estop` falls back to it when
        # the main process does not answer, so an e-stop reaches the lane whatever else hangs.
        self.down_ep = lane_endpoint(self.dir)
        self.summary = RunSummary(cfg.control.hz)
        self.ready = anyio.Event()
        self.stop = anyio.Event()
        self.lane_done = anyio.Event()  # the control lane said "bye" after its last stats
        self.state: dict[str, Any] = {}
        self.exit_code = 0
        self.link: ActLink | None = None
        self.uplink: Uplink | None = None
        self._replies: dict[int, Any] = {}
        self._reply_id = 0
        self.shared: Shared | None = None
        self.ctx = zmq.asyncio.Context()
        self.down = self.ctx.socket(zmq.PUSH)
        self.down.setsockopt(zmq.LINGER, 1000)
        self.down.setsockopt(zmq.SNDHWM, 1000)
        self.up = self.ctx.socket(zmq.PULL)
        self.up.setsockopt(zmq.LINGER, 0)
        self.handshake: Handshake | None = None
        self._main_scope: anyio.CancelScope | None = None  # start-up and run; a signal cancels it
        self.worker_failed = ""
        self._refill_warned = False
        self.client: PolicyClient | None = None
        self.sup: Supervisor | None = None

    # ---- lanes -----------------------------------------------------------------------------

    def send_down(self, msg: dict[str, Any]) -> None:
        try:
            self.down.send(wire.packb(msg), zmq.NOBLOCK)
        except zmq.Again:
            log.error("control lane inbound queue full: dropped %s", msg.get("k"))

    async def control_command(self, cmd: str, args: dict[str, Any], timeout_s: float = 5.0) -> Any:
        """Forward an operator command to the control lane and wait for its reply."""
        self._reply_id += 1
        rid = self._reply_id
        event = anyio.Event()
        self._replies[rid] = event
        self.send_down({"k": "cmd", "id": rid, "cmd": cmd, "args": args})
        try:
            with anyio.fail_after(timeout_s):
                await event.wait()
        except TimeoutError:
            raise TimeoutError(
                f"the control lane did not answer {cmd!r} within {timeout_s} s"
            ) from None
        finally:
            reply = self._replies.pop(rid, None)
        return reply

    async def _receive_up(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            data = await self.up.recv()
            try:
                msg = wire.unpackb(data)
                self._on_up(msg, tg)
            except Exception:
                log.exception("bad message from the control lane")

    def _on_up(self, msg: dict[str, Any], tg: anyio.abc.TaskGroup) -> None:
        kind = msg.get("k")
        if kind == "step":
            self.steps.add(msg)
            self.summary.on_step(msg)
            if self.uplink is not None:
                self.uplink.on_step(msg)
        elif kind == "ask":
            # Planned here, in message order (the steps before it are known, the ones after
            # it are not yet); the act itself runs in a task of its own.
            act = self.link.begin(msg) if self.link is not None else None
            if act is not None:
                tg.start_soon(self.link.finish, act)
            elif self.link is None:
                self.send_down({"k": "act_failed", "ask": msg["id"], "reason": "no policy link"})
        elif kind == "chunk":
            if self.uplink is not None:
                self.uplink.on_chunk(msg)
        elif kind == "stats":
            self.summary.on_stats(msg)
            self.state = msg.get("state", self.state)
            sdnotify.tick_progress(int(msg.get("ticks", 0)))
            self._check_refill()
        elif kind == "state":
            self.state = {k: v for k, v in msg.items() if k != "k"}
        elif kind == "reply":
            event = self._replies.get(msg.get("id"))
            if isinstance(event, anyio.Event):
                self._replies[msg["id"]] = msg
                event.set()
        elif kind == "event":
            self._on_event(msg, tg)
        elif kind == "ready":
            for w in msg.get("warnings", []):
                log.warning("control lane: %s", w)
            self.ready.set()
        elif kind == "bye":
            self.lane_done.set()
        elif kind == "shield":
            pass

    def _check_refill(self) -> None:
        """Realtime: say once when acts take longer than the rows left at the ask cover."""
        c = self.cfg.control
        if self._refill_warned or c.timing != "realtime":
            return
        lat = self.summary.ask_latency()
        if lat["count"] >= 5 and lat["steps"]["p50"] > c.refill_steps:
            self._refill_warned = True
            log.warning(
                "acts take %d steps (p50, %.0f ms) but control.refill_steps is %d: the queue "
                "runs dry before every chunk and the robot holds; raise refill_steps to at "
                "least %d (and keep the policy's horizon above it)",
                lat["steps"]["p50"],
                lat["ms"]["p50"],
                c.refill_steps,
                lat["steps"]["p50"] + 1,
            )

    def _on_event(self, msg: dict[str, Any], tg: anyio.abc.TaskGroup) -> None:
        name = msg.get("name")
        detail = {k: v for k, v in msg.items() if k not in ("k", "name")}
        level = (
            logging.WARNING
            if name
            in (
                "fault",
                "driver_error",
                "overrun",
                "bad_message",
                "loop_died",
                "act_failed",
                "bad_chunk",
                "kernel_error",
                "episode_reset",
                "rt_warning",
            )
            else logging.INFO
        )
        if name != "rt_warning":
            log.log(level, "%s %s", name, detail)
        if name == "episode_end" and self.client is not None:
            tg.start_soon(self._end_worker_episode, str(msg.get("wep")))

    async def _end_worker_episode(self, wep: str) -> None:
        assert self.client is not None
        if self.link is not None:
            self.link.forget(wep)
        try:
            await self.client.end_episode(wep)
        except (PolicyError, TimeoutError) as exc:
            log.warning("end_episode %s: %s", wep, exc)

    # ---- start-up --------------------------------------------------------------------------

    async def _on_control_exit(self, child: Child, code: int) -> bool:
        log.error("the control process exited (code %s): stopping", code)
        self.exit_code = 1
        self._stop_now()  # also when it dies during start-up
        return False

    async def _on_camera_exit(self, child: Child, code: int) -> bool:
        log.error(
            "%s exited (code %s): its frames go stale, no act is asked; restarting",
            child.name,
            code,
        )
        return True

    async def _on_worker_exit(self, child: Child, code: int) -> bool:
        if self.handshake is None:
            self.worker_failed = f"the local policy worker exited with code {code} before it served"
            return False
        log.error("the local policy worker exited (code %s): restarting it", code)
        self.send_down({"k": "episode_lost", "cause": f"local worker exited with code {code}"})
        return True

    async def _start_children(self, sup: Supervisor) -> str:
        await sup.start(
            Child(
                "control",
                control_argv(self.cfg, self.run_id, self.up_ep, self.down_ep, self.shared),
                on_exit=self._on_control_exit,
            )
        )
        for name in self.cfg.cameras:
            await sup.start(
                Child(
                    f"camera:{name}",
                    camera_argv(self.cfg, name, self.shared),
                    on_exit=self._on_camera_exit,
                )
            )
        endpoint = self.opts.worker or self.cfg.policy.worker
        if not endpoint:
            endpoint = f"ipc://{self.dir}/worker-{os.getpid()}.sock"
            argv = worker_argv(self.cfg, endpoint)
            await sup.start(Child("worker", argv, on_exit=self._on_worker_exit))
        return endpoint

    async def _connect_policy(self, endpoint: str, tg: anyio.abc.TaskGroup) -> None:
        assert self.shared is not None
        pl = await connect_policy(
            self.cfg,
            endpoint,
            steps=self.steps,
            rings=self.shared.rings,
            send_down=self.send_down,
            worker_failed=lambda: self.worker_failed,
        )
        self.handshake, self.client, self.link, self.uplink = (
            pl.handshake,
            pl.client,
            pl.link,
            pl.uplink,
        )
        if self.uplink is not None:
            tg.start_soon(self.uplink.run)
        self.summary.link_counters = self.link.counters.uploads
        olh = pl.actions.open_loop_horizon if pl.actions is not None else None
        self.send_down({"k": "contract", "open_loop_horizon": olh})

    # ---- the run ---------------------------------------------------------------------------

    async def run(self) -> int:
        self.steps = StepRing(keep=256)
        try:
            self.shared = create_shared(self.cfg)
            async with anyio.create_task_group() as tg:
                self.up.bind(self.up_ep)
                tg.start_soon(self._receive_up, tg)
                self.sup = Supervisor(tg)
                try:
                    # A signal (or the control lane's death) cancels start-up waits too.
                    with anyio.CancelScope() as self._main_scope:
                        tg.start_soon(self._signals)
                        await self._main(tg)
                    if self.handshake is None and self._main_scope.cancelled_caught:
                        log.warning("stopped during start-up: no policy worker had answered")
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._shutdown()
                tg.cancel_scope.cancel()
        finally:
            self._close()
        if self.opts.summary is not None:
            self.summary.write(self.opts.summary)
        return self.exit_code

    async def _main(self, tg: anyio.abc.TaskGroup) -> None:
        assert self.sup is not None
        endpoint = await self._start_children(self.sup)
        self.down.connect(self.down_ep)
        with anyio.move_on_after(READY_TIMEOUT_S):
            await self.ready.wait()
        if not self.ready.is_set():
            log.error("the control lane did not start ticking within %g s", READY_TIMEOUT_S)
            self.exit_code = 1
            return
        try:
            await self._connect_policy(endpoint, tg)
        except (StartupError, ContractError) as exc:
            log.error("%s", exc)
            self.exit_code = 2
            return
        operator = OperatorServer(self, self.cfg, self.dir)
        await operator.start(tg)
        if self.opts.status:
            tg.start_soon(StatusLine(self).run)
        sdnotify.notify("READY=1", f"STATUS=running at {self.cfg.control.hz:g} Hz")
        tg.start_soon(sdnotify.watchdog_loop, lambda: self.state.get("state", "?"))
        with anyio.move_on_after(self.opts.duration):  # --duration counts from READY
            await self.stop.wait()

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("%s: stopping (the robot holds)", signal.Signals(signum).name)
                self._stop_now()
                return

    def _stop_now(self) -> None:
        self.stop.set()
        if self._main_scope is not None:
            self._main_scope.cancel()

    async def _shutdown(self) -> None:
        sdnotify.notify("STOPPING=1")
        if self.link is not None:
            # (the upload counters are read live: uploads still go on while the lanes stop)
            self.summary.link = {"act_errors": self.link.counters.act_errors}
            for v in self.link.counters.rtt_ms:
                self.summary.rtt.add(v)
        control = self.sup.children.get("control") if self.sup else None
        if (
            control is not None
            and control.process is not None
            and control.process.returncode is None
        ):
            assert self.sup is not None
            self.sup.stopping = True
            self.send_down({"k": "stop"})
            with anyio.move_on_after(3.0):
                await control.exited.wait()
            # The lane's last stats come just before its "bye" (taken by _receive_up).
            with anyio.move_on_after(0.5):
                await self.lane_done.wait()
        if self.sup is not None:
            await self.sup.stop_all(grace_s=5.0, first=("control",))
        if self.client is not None:
            await self.client.close()

    def _close(self) -> None:
        self.up.close(linger=0)
        self.down.close(linger=0)
        self.ctx.term()
        for ep in (self.up_ep, self.down_ep):
            Path(ep.removeprefix("ipc://")).unlink(missing_ok=True)
        if self.shared is not None:
            self.shared.unlink()


def lock_run_dir(run_dir: Path) -> int:
    """Hold `run_dir/robotd.pid` locked for the daemon's life: one daemon per run directory,
    since its sockets (control.sock, lane.sock) have fixed names there."""
    path = run_dir / "robotd.pid"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StartupError(
            f"runtime.dir {run_dir} is in use by robotd pid {holder} (lock {path}); "
            "give each daemon its own runtime.dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def run(cfg: Config, opts: Options) -> int:
    """Run the daemon until a signal, --duration or a fatal error; returns the exit code."""
    try:
        daemon = Daemon(cfg, opts)
    except StartupError as exc:
        log.error("%s", exc)
        return 2
    return anyio.run(daemon.run, backend_options={"use_uvloop": True})


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
