"""The main process (the async lane): the composition root of one run of robotd.

It creates the shared memory, starts the control process, the cameras and (unless a
remote worker is named) a local worker (robotd.runtime.children), links the lanes
(robotd.runtime.bridge), brings the policy link up (robotd.link.session), serves
operators (robotd.operator), notifies systemd, and on SIGINT/SIGTERM or the end of
--duration stops everything and writes the summary. Everything here runs on anyio (uvloop).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import zmq.asyncio

from robotd.config import Config, runtime_dir
from robotd.contract import ContractError
from robotd.control.ports import orphan_hold_s
from robotd.exits import exit_words
from robotd.lane.messages import Contract, Shutdown
from robotd.link.connect import StartupError, worker_endpoint_problem
from robotd.link.session import PolicySession
from robotd.operator.server import OperatorServer
from robotd.operator.status import StatusLine
from robotd.runtime import sdnotify
from robotd.runtime.bridge import LaneBridge
from robotd.runtime.children import Children, LaneEndpoints, Shared, create_shared
from robotd.runtime.events import EventLog, StaleCameras
from robotd.runtime.options import Options
from robotd.runtime.procutil import setup_logging, stop_on_signal
from robotd.runtime.recorder import Recorder, open_recorder
from robotd.runtime.routes import Routes
from robotd.runtime.rundir import PID_FILE, disown_run_dir, lock_run_dir, remove_socket_file
from robotd.runtime.rundir_watch import SocketWatch, watch_sockets
from robotd.runtime.summary import RunSummary
from robotd.runtime.supervisor import Supervisor
from robotd.runtime.view import DaemonView, silent_after_s
from robotd.shm import FrameRing

log = logging.getLogger("robotd")

__all__ = ["Daemon", "Options", "run", "setup_logging"]

READY_TIMEOUT_S = 30.0
# Said after a hello went unanswered while the local worker lives on: why it did not answer.
NOT_SERVING = (
    "; the local worker is running but not serving yet: its policy is still loading, or"
    " stuck in its set-up"
)
FIRST_FRAME_WAIT_S = 10.0  # a camera process that is slow to start (a loaded machine, USB)


class Daemon:
    """One run of robotd (see the module docstring)."""

    def __init__(self, cfg: Config, opts: Options) -> None:
        self.cfg = cfg
        self.opts = opts
        self.run_id = secrets.token_hex(3)
        self.dir = runtime_dir(cfg)
        # before any socket in it is touched; the control lane inherits it (rundir)
        self._lock = lock_run_dir(self.dir, orphan_hold_s(cfg.control.orphan_s))
        self.ctx = zmq.asyncio.Context()
        c = cfg.control
        silent_s = silent_after_s(c.hz, c.stats_interval_s)
        ages = {name: cam.max_age_ms for name, cam in cfg.cameras.items()}
        self.bridge = LaneBridge(
            self.ctx, self.dir, silent_after_s=silent_s, hz=c.hz, cameras=StaleCameras(ages)
        )
        self.summary = RunSummary(cfg.control.hz)
        self.stop = anyio.Event()
        self.exit_code = 0
        self._control_code: int | None = None  # the control lane's exit code, if it exited
        self._waiting = ""  # what start-up waits for, in words (systemd's STATUS)
        self.shared: Shared | None = None
        self.session: PolicySession | None = None
        self._scope: anyio.CancelScope | None = None  # start-up and run; a signal cancels it
        self.events = EventLog(cfg.control, self.summary, self._episode_ended, self.bridge.clock)
        self.view = DaemonView(
            self.run_id,
            cfg.robot.name,
            self.summary,
            lambda: self.bridge.status,
            self._link,
            lambda: self.routes.robot(self.bridge.status.queue if self.bridge.status else None),
            self.bridge.lane_age,
            lambda: self.recorder.store.health() if self.recorder is not None else None,
        )
        self.recorder: Recorder | None = None
        self.routes = Routes(self.summary, self.events, lambda: self.session, None)

    def _link(self) -> dict[str, object]:
        return self.session.state() if self.session is not None else {"state": "connecting"}

    def _worker_lost(self, cause: str) -> None:
        if self.session is not None:
            self.session.worker_gone(cause)

    def _episode_ended(self, wep: str) -> None:
        if self.session is not None:
            self.session.on_episode_end(wep)

    # ---- the run ---------------------------------------------------------------------------

    async def run(self) -> int:
        self.recorder = open_recorder(
            self.cfg, live_port=self.opts.foxglove, live_host=self.opts.foxglove_host
        )
        self.routes.recorder = self.recorder
        self.routes.install(self.bridge)
        try:
            self.shared = create_shared(self.cfg)
            if self.recorder is not None:  # trace.frames = "all" reads the frames from them
                self.recorder.read_rings(self.shared.rings)
            async with anyio.create_task_group() as tg:
                self.bridge.bind()
                tg.start_soon(self.bridge.run)
                sup = Supervisor(tg)
                children = Children(
                    self.cfg,
                    sup,
                    config_dir=self.opts.config_dir,
                    lock_fd=self._lock,
                    on_control_exit=self._control_exited,
                    on_worker_lost=self._worker_lost,
                    served=lambda: self.session is not None and self.session.served,
                )
                try:
                    with anyio.CancelScope() as self._scope:
                        tg.start_soon(self._signals)
                        await self._main(tg, children)
                    if self._scope.cancelled_caught and self.summary.link is None:
                        self._early_stop()
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._shutdown(sup, children)
                tg.cancel_scope.cancel()
        finally:
            self._close()
        if self.summary.last is not None:  # the control lane ran
            log.info("%s", self.summary.line())
        if self.opts.summary is not None:
            self.summary.write(self.opts.summary)
        return self.exit_code

    async def _main(self, tg: anyio.abc.TaskGroup, children: Children) -> None:
        assert self.shared is not None
        endpoint = self.opts.worker or self.cfg.policy.worker
        local = None if endpoint else f"stream+ipc://{self.dir}/worker-{self.run_id}.sock"
        b = self.bridge
        ends = LaneEndpoints(b.up_ep, b.down_ep, b.estop_ep)
        await children.start(self.run_id, ends, self.shared, local)
        b.connect()
        with anyio.move_on_after(READY_TIMEOUT_S):
            await self.routes.ready.wait()
        if not self.routes.ready.is_set():
            log.error("the control lane did not start ticking within %g s", READY_TIMEOUT_S)
            self.exit_code = 1
            return
        # watched from now: a lane.sock removed while a policy loads for minutes is noticed
        watch = SocketWatch(_files([b.estop_ep]), held={self.dir / PID_FILE: self._lock})
        tg.start_soon(watch_sockets, watch, self._sockets_lost)
        wait = self._worker_wait()
        self._waiting = f"waiting up to {wait['wait_s']:g} s for {wait['source']} to answer hello"
        # READY once the loop ticks: the robot is held safely and lane.sock takes the e-stop;
        # a policy loading for minutes does not hold `systemctl start` (STATUS says why)
        sdnotify.notify("READY=1", f"STATUS={self._unit_status()}")
        tg.start_soon(sdnotify.watchdog_loop, self._unit_status)
        contract = await self._connect(tg, children, endpoint, local, wait)
        if contract is None:
            return
        if self.cfg.robot.start == "episode":  # the contract starts it: not before the cameras
            await first_frames(self.shared.rings, FIRST_FRAME_WAIT_S)
        b.send(contract)
        if not contract.ready:  # an openpi warm-up holds acts: the lane hears when it is over
            tg.start_soon(self._tell_ready, b)
        self.summary.link = self.session.counters
        self.summary.session = self.session
        on_command = self.recorder.operator if self.recorder is not None else None
        operator = OperatorServer(
            self.view, b, self.cfg, self.dir, self.ctx, self.session, on_command
        )
        await operator.start(tg)
        watch.add(_files([operator.control_ep, operator.telemetry_ep]))
        if self.opts.status:
            tg.start_soon(StatusLine(self.view).run)
        self._waiting = ""
        sdnotify.notify(f"STATUS=running at {self.cfg.control.hz:g} Hz")
        with anyio.move_on_after(self.opts.duration):  # --duration counts from serving
            await self.stop.wait()

    async def _connect(
        self,
        tg: anyio.abc.TaskGroup,
        children: Children,
        endpoint: str,
        local: str | None,
        wait: dict[str, Any],
    ) -> Contract | None:
        """The policy session opened and its first contract, or None (logged, exit code 2)
        when the policy never answered or its contract is refused."""
        assert self.shared is not None
        b = self.bridge
        self.session = PolicySession(
            self.cfg,
            endpoint or local or "",
            rings=self.shared.rings,
            send_down=b.send,
            worker_failed=lambda: children.worker_failed,
            task=lambda: b.status.task if b.status is not None else "",
            lane_status=lambda: b.status,
        )
        self.session.trace = self.recorder  # uploads, refusals, reconnects (None: no trace)
        try:
            return await self.session.connect(tg, **wait)
        except (StartupError, ContractError) as exc:
            # A local worker alive that never answered its hello: its policy still loads (or
            # is stuck). One that answered and was refused (its contract) is serving.
            waiting = isinstance(exc, StartupError) and local is not None
            waiting = waiting and not self.session.hello_answered and children.alive("worker")
            log.error("%s%s", exc, NOT_SERVING if waiting else "")
            self.exit_code = 2
            return None

    async def _tell_ready(self, b: LaneBridge) -> None:
        """The lane's contract again, ready, once acts no longer wait (robot.start =
        "episode" starts the first episode then)."""
        assert self.session is not None
        b.send(await self.session.answering())

    async def _sockets_lost(self, lost: list[str]) -> None:
        """The run directory lost its sockets (nobody new can reach the robot, an e-stop
        included) or its pid file (a second daemon could start on it and open the robot):
        the robot is e-stopped here (the lane is still connected) and the daemon stops, once
        torque is off, for a restart that makes them again, latched."""
        what = ", ".join(lost)
        disown_run_dir()  # what is there now may be a second daemon's: leave it at the end
        means = (
            "operators can no longer reach this daemon (robotctl, robotctl estop through "
            "lane.sock)" if any(".sock" in x for x in lost)
            else "a second daemon could start on it beside this one"
        )
        log.critical(
            "run directory %s: %s: %s: e-stopping the robot and stopping (a restart makes "
            "them again and starts latched)", self.dir, what, means,
        )
        try:
            await self.bridge.estop(f"run directory lost: {what}"[:200])
            with anyio.move_on_after(5.0):  # a category-1 stop turns torque off after 0.5 s
                while (st := self.bridge.status) is None or st.torque:
                    await anyio.sleep(0.05)
        except TimeoutError as exc:
            log.critical("%s", exc)
        self.exit_code = 1
        self._stop_now()

    def _unit_status(self) -> str:
        """systemd's STATUS: the lane's state, and while start-up waits for the worker what
        it waits for."""
        state = str(self.view.state().get("state") or "starting")
        return f"{state} ({self._waiting})" if self._waiting else state

    def _worker_wait(self) -> dict[str, Any]:
        """How long start-up waits for the worker's hello, and where its endpoint came
        from. policy.start_s for a local worker: its start (the policy loading) is this
        daemon's own start-up, and --duration counts from serving; one that dies is noticed
        at once (worker_failed), one that lives on without serving (its policy stuck) is
        given up at start_s. A remote worker: start_s, or --duration if shorter (a run asked
        to last 3 s does not wait 30 for a worker elsewhere that does not answer)."""
        wait = self.cfg.policy.start_s
        if self.opts.worker or self.cfg.policy.worker:
            source = "--worker" if self.opts.worker else "policy.worker"
            wait = min(wait, self.opts.duration or wait)
        else:
            source = f"the local worker, {self.cfg.policy.serve}"
        return {"wait_s": wait, "source": source}

    async def _signals(self) -> None:
        await stop_on_signal(self._stop_now)

    def _control_exited(self, code: int) -> None:
        self.exit_code = 1
        self._control_code = code
        self._stop_now()  # also when it dies during start-up

    def _early_stop(self) -> None:
        """Say what start-up was waiting for when a signal stopped it. A control lane that
        exited said so itself (the supervisor's line, after the lane's own error): the
        worker was never the cause then."""
        if self._control_code is not None:
            return
        if not self.routes.ready.is_set():
            log.warning("stopped during start-up: the control lane was not ticking yet")
        else:
            log.warning("stopped during start-up: no policy worker had answered")

    def _stop_now(self) -> None:
        self.stop.set()
        if self._scope is not None:
            self._scope.cancel()

    async def _shutdown(self, sup: Supervisor, children: Children) -> None:
        sdnotify.notify("STOPPING=1")
        if children.control_alive():
            sup.stopping = True
            self.bridge.send(Shutdown())
            with anyio.move_on_after(3.0):
                await sup.children["control"].exited.wait()
            # The lane's last stats come just before its Bye (taken by the bridge).
            with anyio.move_on_after(0.5):
                await self.routes.lane_done.wait()
        if self.session is not None:  # before the worker stops: its going is no news
            await self.session.close()
        await sup.stop_all(grace_s=5.0, first=("control",))
        if self.recorder is not None:  # the lane's last messages are in: close the files
            if self._control_code is not None:  # it died: its episode never ended there
                ended = exit_words(self._control_code)
                self.recorder.lane_lost(f"the control lane is gone: {ended}")
            await anyio.to_thread.run_sync(self.recorder.store.close)

    def _close(self) -> None:
        if self.recorder is not None:
            self.recorder.store.close()  # (already closed unless the shutdown failed)
        self.bridge.close()
        self.ctx.term()
        for ep in (self.bridge.down_ep, self.bridge.estop_ep):
            remove_socket_file(Path(ep.removeprefix("ipc://")))
        if self.shared is not None:
            self.shared.unlink()


def _files(endpoints: list[str]) -> list[Path]:
    """The socket files of the ipc endpoints among `endpoints`."""
    return [Path(e.removeprefix("ipc://")) for e in endpoints if e.startswith("ipc://")]


async def first_frames(rings: Mapping[str, FrameRing], timeout_s: float) -> None:
    """Wait until every camera has delivered a frame (at most `timeout_s`, then a warning):
    an episode started before would ask its first acts for windows whose frames never
    existed, and they would fail. The rings are shared memory: there is no event to wait
    on, so they are looked at every 20 ms."""
    deadline = time.monotonic() + timeout_s
    waiting = [name for name, ring in rings.items() if ring.latest() is None]
    while waiting and time.monotonic() < deadline:
        await anyio.sleep(0.02)
        waiting = [name for name in waiting if rings[name].latest() is None]
    if waiting:
        log.warning(
            "cameras %s delivered no frame within %g s: the episode starts without them "
            "(acts whose windows read them fail until they do)", waiting, timeout_s
        )


def run(cfg: Config, opts: Options) -> int:
    """Run the daemon until a signal, --duration or a fatal error; returns the exit code."""
    problem = worker_endpoint_problem(cfg.policy.link, opts.worker) if opts.worker else None
    if problem is not None:  # checked as policy.worker is at load
        log.error("--worker: %s", problem)
        return 2
    try:
        daemon = Daemon(cfg, opts)
    except StartupError as exc:
        log.error("%s", exc)
        return 2
    return anyio.run(daemon.run, backend_options={"use_uvloop": True})
