"""A copy of the policy: its own process (`python -m robotd.worker.child`), or, with
`--copies 0`, a thread of the worker (with `--inline`, the worker's poll loop calls `job`
itself). It builds the policy, says it is ready, then answers
the jobs the worker's main process sends it (robotd.worker.pipe frames), one at a time.

The messages (maps; `k` says which):
- main -> copy: `init {spec, kwargs, path}` (a process copy, after its `boot`), `act {seq,
  episode, step, steps, observations, params, rtc?}`, `end {seq, episode}`, `stop`.
- copy -> main: `boot`, `ready {pid, policy, contract, params}`, `failed {error}` (the policy
  cannot be built; the copy exits), `done {seq, ok, result | error}`, `lost {seq, message}`
  (a MemoryError: the copy reports it and exits with EXIT_MEMORY, since a policy that ran
  out of memory mid-call is in no known state).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from robotd import wire
from robotd.worker import pipe
from robotd.worker.channel import ChannelClosed, CopyEnd
from robotd.worker.params import params_to_wire
from robotd.worker.policy_host import PolicyCallError, PolicyHost, PolicyLoadError

log = logging.getLogger("robotd.worker.copy")

EXIT_LOAD = 2  # the policy cannot be built
EXIT_MEMORY = 99  # a MemoryError in a policy call (reported first, if it could be)
OOM_SCORE_RAISE = 500  # the kernel's OOM killer takes a copy before the worker itself


def serve_copy(sock: CopyEnd, spec: str, kwargs: Mapping[str, Any]) -> int:
    """Build the policy and answer jobs on `sock` (the copy's end of its channel) until
    `stop` or the worker's end closes; returns the exit code."""
    host = build_host(sock, spec, kwargs)
    if not isinstance(host, PolicyHost):
        return host
    gc.freeze()  # what was built is kept: the collector scans only what each job makes
    while True:
        try:
            code = _next_job(host, sock)
        except ChannelClosed:  # the worker has gone
            return 0
        if code is not None:
            return code


def build_host(sock: CopyEnd, spec: str, kwargs: Mapping[str, Any]) -> PolicyHost | int:
    """Build the policy and say `ready` on `sock` (or `failed`, returning the exit code)."""
    try:
        host = PolicyHost(spec, kwargs)
    except PolicyLoadError as err:
        _send(sock, {"k": "failed", "error": str(err)})
        return EXIT_LOAD
    except MemoryError as err:
        _send(sock, {"k": "failed", "error": f"out of memory building the policy: {err}"})
        return EXIT_MEMORY
    _send(
        sock,
        {
            "k": "ready",
            "pid": os.getpid(),
            "policy": spec,
            "contract": {
                "observations": host.observations.to_wire() if host.observations else None,
                "actions": host.actions_wire(),
            },
            "params": params_to_wire(host.params, {}),
        },
    )
    return host


def _next_job(host: PolicyHost, sock: CopyEnd) -> int | None:
    """Receive one job and answer it; an exit code if the copy must stop. (Its own
    function: what the job held is let go on return, so its buffers can be read into
    again, robotd.worker.channel.CopyEnd.recv.)"""
    try:
        msg = pipe.unpack(sock.recv())
    except wire.WireError as err:  # only the worker itself talks to us: its bug
        log.error("copy: dropped a malformed job: %s", err)
        return None
    if not isinstance(msg, dict) or msg.get("k") == "stop":
        return 0
    try:
        reply = job(host, msg)
    except MemoryError as err:
        with contextlib.suppress(BaseException):
            _send(sock, {"k": "lost", "seq": msg.get("seq"), "message": memory_text(err)})
        return EXIT_MEMORY
    try:
        _send(sock, reply)
    except wire.WireError as err:
        _send(sock, error_done(msg.get("seq"), "internal", f"cannot send the answer: {err}"))
    return None


def job(host: PolicyHost, msg: dict[str, Any]) -> dict[str, Any]:
    """One `act` or `end` job answered: its `done` message (MemoryError is raised)."""
    seq = msg.get("seq")
    try:
        if msg.get("k") == "end":
            host.end_episode(msg["episode"])
            return {"k": "done", "seq": seq, "ok": True, "result": {}}
        started = time.perf_counter()
        task = msg.get("task")
        episode = host.begin(
            msg["episode"], msg.get("params") or {}, task if isinstance(task, str) else ""
        )
        inputs = host.inputs(msg["steps"], msg["observations"])
        begun = time.perf_counter()
        rows = host.infer(inputs, msg["episode"], rtc=msg.get("rtc"))
        done = time.perf_counter()
    except PolicyCallError as err:
        return error_done(seq, err.code, str(err))
    except MemoryError:
        raise
    except Exception as err:  # a worker bug: answered, and the copy goes on
        log.exception("copy: internal error")
        return error_done(seq, "internal", f"{type(err).__name__}: {err}")
    timing = {"infer_ms": (done - begun) * 1e3, "begin_ms": (begun - started) * 1e3}
    result = {"actions": rows, "timing": timing, "answered": episode.steps}
    return {"k": "done", "seq": seq, "ok": True, "result": result}


def error_done(seq: Any, code: str, message: str) -> dict[str, Any]:
    return {"k": "done", "seq": seq, "ok": False, "error": {"code": code, "message": message}}


def memory_text(err: MemoryError) -> str:
    text = str(err) or "no message"
    return f"out of memory: MemoryError in a policy call ({text[:200]})"


def _send(sock: CopyEnd, msg: dict[str, Any]) -> None:
    sock.send(pipe.pack(msg))


def _prepare_process(memory_bytes: int) -> None:
    """What a copy process does before it loads anything: stay out of the terminal's Ctrl-C
    (the worker stops its copies), volunteer to the OOM killer, cap its address space."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, ValueError), open("/proc/self/oom_score_adj", "r+") as f:
        score = int(f.read().strip() or 0)
        f.seek(0)
        f.write(str(min(1000, score + OOM_SCORE_RAISE)))
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def main(argv: list[str] | None = None) -> int:
    """`python -m robotd.worker.child FD IDENTITY [--memory-bytes N]`: FD is the copy's end
    of its channel (robotd.worker.channel), IDENTITY its name in the worker's logs."""
    from robotd.runtime.procutil import die_with_parent, line_start

    p = argparse.ArgumentParser(prog="robotd-copy")
    p.add_argument("fd", type=int)
    p.add_argument("identity")
    p.add_argument("--memory-bytes", type=int, default=0)
    args = p.parse_args(argv)
    die_with_parent()
    logging.basicConfig(
        level=logging.INFO,
        format=line_start()
        + "%(asctime)s %(levelname)s robotd.worker copy %(process)d: %(message)s",
        stream=sys.stderr,
    )
    try:
        _prepare_process(args.memory_bytes)
    except (OSError, ValueError) as err:
        print(f"robotd copy: cannot cap memory at {args.memory_bytes}: {err}", file=sys.stderr)
        return EXIT_LOAD
    # What is written before the copy exits (failed, lost) stays readable in the socket.
    sock = CopyEnd(socket.socket(fileno=args.fd))
    try:
        _send(sock, {"k": "boot"})
        init = pipe.unpack(sock.recv())
        sys.path[:0] = [p for p in init.get("path", []) if isinstance(p, str) and p not in sys.path]
        return serve_copy(sock, init["spec"], init.get("kwargs") or {})
    except (ChannelClosed, OSError):  # the worker went before the copy was built
        return 0
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
