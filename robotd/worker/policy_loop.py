"""The worker's policy thread: runs the jobs the poll loop hands it, one at a time, in
order, and sends each reply back to the poll loop on an inproc socket."""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass
from typing import Any

import zmq

from robotd import wire
from robotd.worker.policy_host import PolicyCallError, PolicyHost

log = logging.getLogger("robotd.worker")


@dataclass(slots=True)
class Job:
    """One request handed to the policy thread; `route` is the ROUTER envelope."""

    cmd: str
    route: list[bytes]
    rid: int
    episode: str
    step: int = 0
    steps: list[int] | None = None
    observations: list[dict[str, Any]] | None = None
    received: float = 0.0


def send(sock: zmq.Socket, route: list[bytes], reply: dict[str, Any]) -> None:
    sock.send_multipart([*route, wire.packb(reply)])


def reply_error(
    sock: zmq.Socket | None,
    route: list[bytes],
    rid: int | None,
    code: str,
    message: str,
    extra: dict[str, Any] | None = None,
) -> None:
    log.debug("error reply %s: %s", code, message)
    assert sock is not None
    error = {"code": code, "message": message, **(extra or {})}
    send(sock, route, {"id": rid, "ok": False, "error": error})


def drop_queued(jobs: queue.Queue[Job | None]) -> None:
    while True:
        try:
            jobs.get_nowait()
        except queue.Empty:
            return


class PolicyLoop:
    """The policy thread: runs jobs in order and sends each reply to the poll loop."""

    def __init__(
        self, host: PolicyHost, ctx: zmq.Context, done_addr: str, jobs: queue.Queue[Job | None]
    ) -> None:
        self.host = host
        self.ctx = ctx
        self.done_addr = done_addr
        self.jobs = jobs

    def run(self) -> None:
        out = self.ctx.socket(zmq.PAIR)
        out.connect(self.done_addr)
        try:
            while (job := self.jobs.get()) is not None:
                try:
                    reply = {"id": job.rid, "ok": True, "result": self._run(job)}
                except PolicyCallError as err:
                    reply = error_reply(job.rid, err.code, str(err))
                except Exception as err:  # never let one request stop the worker
                    log.exception("internal error on %s", job.cmd)
                    reply = error_reply(job.rid, "internal", f"{type(err).__name__}: {err}")
                try:
                    send(out, job.route, reply)
                except wire.WireError as err:
                    send(out, job.route, error_reply(job.rid, "internal", str(err)))
        finally:
            out.close(linger=0)

    def _run(self, job: Job) -> dict[str, Any]:
        if job.cmd == "end":
            self.host.end_episode(job.episode)
            return {}
        assert job.steps is not None and job.observations is not None
        self.host.begin(job.episode)
        observations = self.host.decode_frames(job.steps, job.observations)
        inputs = self.host.inputs(job.steps, observations)
        start = time.perf_counter()
        rows = self.host.infer(inputs, job.episode)
        done = time.perf_counter()
        return {
            "actions": rows,
            "timing": {"infer_ms": (done - start) * 1e3, "queue_ms": (start - job.received) * 1e3},
            "step": job.step,
            "episode": job.episode,
        }


def error_reply(rid: int | None, code: str, message: str) -> dict[str, Any]:
    return {"id": rid, "ok": False, "error": {"code": code, "message": message}}
