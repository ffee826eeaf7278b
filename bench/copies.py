"""Copies of the policy in child processes: what the process boundary costs an act, and how
long a lost copy's episode takes to go on in a new one.

    python bench/copies.py [--acts 200] [--kills 10] [--json]

1. handoff: act round trips with a window of N raw 224x224x3 uint8 frames inline (N = 1,
   4, 16) against `robotd serve --copies 0` (the policy in a thread of the worker, as before
   copies existed: the baseline) and `--copies 1` (a copy process: the window crosses ipc).
   p50 per mode and the difference, all in the same run.
2. codec: a 16-frame window packed, sent over ipc and unpacked, in this process, with the
   copies' codec (robotd.worker.pipe: frames out of band, zero-copy) against robotd.wire
   (arrays inside the msgpack).
3. replacement: kill -9 of the copy holding an episode while it computes, then the next
   episode's first act, with `--copies 1` (a new copy must start: the baseline) and
   `--copies 2` (a warm spare is ready). detect: kill -> the act in flight answered
   episode_lost; resume: kill -> the new episode's first chunk.

With --json the last line is {"handoff": {"1" | "4" | "16": {"thread_ms", "process_ms",
"extra_ms"}}, "codec_16": {"pipe_ms", "wire_ms", "ratio"}, "replacement": {"copies_1" |
"copies_2": {"detect_ms_p50", "resume_ms_p50", "resume_ms_max"}},
"resume_ratio_spare_vs_none"}.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/copies.py`

import numpy as np
import zmq

from bench._common import BenchError, child_env, emit_json, median, print_table, ratio, run_main
from robotd import wire
from robotd.contract import Actions, Observations, Stream
from robotd.worker import pipe

SIDE = 224
WINDOWS = (1, 4, 16)
DEADLINE_S = 60.0


class Window:
    """Reads `frames` steps of `top`; answers at once (or sleeps when the act asks)."""

    actions = Actions(open_loop_horizon=8)

    def __init__(self, frames: int = 1) -> None:
        self.observations = Observations(streams={"top": Stream(at=list(range(1 - frames, 1)))})

    def infer(self, inputs: dict[str, Any]) -> np.ndarray:
        last = inputs["observations"][-1]
        if "sleep" in last:
            time.sleep(float(last["sleep"]))
        return np.zeros((8, 7))


class Worker:
    """`robotd serve bench.copies:Window` on ipc, and a DEALER to it."""

    def __init__(self, *flags: str, frames: int = 1) -> None:
        self.dir = tempfile.mkdtemp(prefix="robotd-bc-")
        self.endpoint = f"ipc://{self.dir}/w.sock"
        argv = [sys.executable, "-m", "robotd", "serve", "bench.copies:Window"]
        argv += ["--bind", self.endpoint, "--arg", f"frames={frames}", *flags]
        self.proc = subprocess.Popen(
            argv, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not re.search(r"listening on", line):
            self.proc.kill()
            raise BenchError(f"the worker did not start: {line.strip() or 'no output'}")
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoint)
        self.rid = 0
        self.replies: dict[Any, dict[str, Any]] = {}

    def send(self, msg: dict[str, Any]) -> int:
        self.rid += 1
        self.sock.send(wire.packb({"id": self.rid, **msg}))
        return self.rid

    def recv(self, rid: int) -> dict[str, Any]:
        deadline = time.monotonic() + DEADLINE_S
        while rid not in self.replies:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1e3) + 1):
                raise BenchError(f"the worker did not answer request {rid}")
            reply = wire.unpackb(self.sock.recv())
            self.replies[reply.get("id")] = reply
        return self.replies.pop(rid)

    def act(self, episode: str, frames: list[np.ndarray], **extra: Any) -> int:
        n = len(frames)
        obs = [{"top": f} for f in frames]
        obs[-1].update(extra)
        steps = list(range(n))
        msg = {"cmd": "act", "episode": episode, "step": n - 1, "steps": steps}
        return self.send({**msg, "observations": obs})

    def ping(self) -> dict[str, Any]:
        return self.recv(self.send({"cmd": "ping"}))["result"]

    def wait(self, what: str, predicate: Any) -> Any:
        deadline = time.monotonic() + DEADLINE_S
        while not (found := predicate(self.ping())):
            if time.monotonic() > deadline:
                raise BenchError(f"timed out waiting for {what}")
            time.sleep(0.005)  # polling the worker's own health: the condition we wait on
        return found

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _handoff(acts: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    for n in WINDOWS:
        frames = [rng.integers(0, 255, (SIDE, SIDE, 3), np.uint8) for _ in range(n)]
        p50 = {}
        for mode, copies in (("thread", "0"), ("process", "1")):
            worker = Worker("--copies", copies, frames=n)
            try:
                times = []
                for i in range(acts + 5):
                    started = time.perf_counter()
                    reply = worker.recv(worker.act("H", frames))
                    if not reply["ok"]:
                        raise BenchError(f"act failed: {reply['error']}")
                    if i >= 5:  # the first acts warm both sides up
                        times.append((time.perf_counter() - started) * 1e3)
                p50[mode] = median(times)
            finally:
                worker.close()
        out[str(n)] = {
            "thread_ms": round(p50["thread"], 3),
            "process_ms": round(p50["process"], 3),
            "extra_ms": round(p50["process"] - p50["thread"], 3),
        }
    return out


def _codec(acts: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 255, (SIDE, SIDE, 3), np.uint8) for _ in range(16)]
    msg = {
        "k": "act",
        "seq": 1,
        "steps": list(range(16)),
        "observations": [{"top": f} for f in frames],
    }
    ctx = zmq.Context()
    tmp = tempfile.mkdtemp(prefix="robotd-bc-")
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind(f"ipc://{tmp}/c.sock")
    b.connect(f"ipc://{tmp}/c.sock")
    times: dict[str, list[float]] = {"pipe": [], "wire": []}
    try:
        for _ in range(acts):
            for name in times:
                started = time.perf_counter()
                if name == "pipe":
                    a.send_multipart(pipe.pack(msg), copy=False)
                    got = pipe.unpack([f.buffer for f in b.recv_multipart(copy=False)])
                else:
                    a.send(wire.packb(msg))
                    got = wire.unpackb(b.recv())
                if got["observations"][15]["top"].shape != (SIDE, SIDE, 3):
                    raise BenchError("the window did not come through")
                times[name].append((time.perf_counter() - started) * 1e3)
    finally:
        a.close(0)
        b.close(0)
        ctx.term()
        shutil.rmtree(tmp, ignore_errors=True)
    pipe_ms, wire_ms = median(times["pipe"]), median(times["wire"])
    return {
        "pipe_ms": round(pipe_ms, 3),
        "wire_ms": round(wire_ms, 3),
        "ratio": ratio(pipe_ms, wire_ms),
    }


def _replacement(copies: int, kills: int) -> dict[str, float]:
    worker = Worker("--copies", str(copies), "--hang-s", "60")
    frame = [np.zeros((SIDE, SIDE, 3), np.uint8)]
    detect, resume = [], []
    try:
        # One robot's run: its episode goes on in a new one after each loss.
        if not worker.recv(worker.act("E0", frame))["ok"]:
            raise BenchError("the first act failed")
        for i in range(kills):
            worker.wait(
                "ready copies",
                lambda h: h["pool"]["ready"] == copies and h["pool"]["starting"] == 0,
            )
            pid = next(c["pid"] for c in worker.ping()["copies"] if c["episode"] == f"E{i}")
            in_flight = worker.act(f"E{i}", frame, sleep=30.0)
            worker.wait(
                "the act in the copy",
                lambda h, p=pid: any(c["pid"] == p and c["state"] == "busy" for c in h["copies"]),
            )
            killed = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            reply = worker.recv(in_flight)
            if reply["ok"] or reply["error"]["code"] != "episode_lost":
                raise BenchError(f"the act in flight was not lost: {reply}")
            detect.append((time.perf_counter() - killed) * 1e3)
            reply = worker.recv(worker.act(f"E{i + 1}", frame))
            if not reply["ok"]:
                raise BenchError(f"the new episode's act failed: {reply['error']}")
            resume.append((time.perf_counter() - killed) * 1e3)
    finally:
        worker.close()
    return {
        "detect_ms_p50": round(median(detect), 2),
        "resume_ms_p50": round(median(resume), 2),
        "resume_ms_max": round(max(resume), 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--acts", type=int, default=200, help="acts per handoff mode (default 200)")
    p.add_argument("--kills", type=int, default=10, help="kills per replacement mode (default 10)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = p.parse_args(argv)
    if args.acts < 1 or args.kills < 1:
        p.error("--acts and --kills must be >= 1")
    handoff = _handoff(args.acts)
    codec = _codec(args.acts)
    replacement = {f"copies_{c}": _replacement(c, args.kills) for c in (1, 2)}
    print_table(
        ["window (224x224x3 frames)", "thread p50 ms", "process p50 ms", "extra ms"],
        [
            [
                f"{n} frame(s), {int(n) * SIDE * SIDE * 3 / 1e6:.2f} MB",
                h["thread_ms"],
                h["process_ms"],
                h["extra_ms"],
            ]
            for n, h in handoff.items()
        ],
        title="act round trip: the policy in a thread (baseline) vs in a copy process",
        digits=3,
    )
    print_table(
        ["codec, 16 frames over ipc", "p50 ms"],
        [
            ["robotd.worker.pipe (out of band)", codec["pipe_ms"]],
            ["robotd.wire (inline)", codec["wire_ms"]],
        ],
        digits=3,
    )
    print_table(
        [
            "kill -9 of the copy holding an episode",
            "detect p50 ms",
            "resume p50 ms",
            "resume max ms",
        ],
        [
            [f"--copies {k[-1]}", v["detect_ms_p50"], v["resume_ms_p50"], v["resume_ms_max"]]
            for k, v in replacement.items()
        ],
        digits=2,
    )
    if args.json:
        emit_json(
            {
                "handoff": handoff,
                "codec_16": codec,
                "replacement": replacement,
                "resume_ratio_spare_vs_none": ratio(
                    replacement["copies_2"]["resume_ms_p50"],
                    replacement["copies_1"]["resume_ms_p50"],
                ),
            }
        )
    return 0


if __name__ == "__main__":
    run_main(main)
