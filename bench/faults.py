"""Faults during a realtime sim run: copies of the policy killed, the whole worker restarted.

    python bench/faults.py [--kills 20] [--copies 2] [--json]

A real daemon (config/sim.toml, realtime timing) drives the demo policy served by a real
`robotd serve --copies N` that this bench started, so that it can kill it. First --kills
times, at random moments, the copy of the policy holding the episode is killed (SIGKILL);
then the whole worker is killed and started again 3 times, the last one away longer than
max_hold_steps (the watchdog ends that episode; the bench starts the next one, as an
operator would). For each loss the daemon's own events say when the new worker-side
episode's first row played (`resumed`: ticks held since the reset, monotonic time), so:

  resume_ms   from the kill to the first row of the new episode played;
  hold ticks  ticks the robot held between the reset and that row.

Targets (issue 8): episode_resets == kills + worker_restarts; stale_rows_played == 0;
hold_after_loss_ticks_max <= 1; the daemon alive at the end; with --copies 2,
resume_ms_p50 <= one act round trip + 2 ticks.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/faults.py`

from bench._common import BenchError, child_env, emit_json, print_table, run_main

HZ = 30.0
RESTARTS_S = (1.0, 3.0, 12.0)  # the last: longer than max_hold_steps (300 ticks = 10 s)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kills", type=int, default=20, help="copy kills (20)")
    p.add_argument("--copies", type=int, default=2, help="the worker's --copies (2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    return p.parse_args(argv)


class Log:
    """A process's output, line by line, kept and searchable (read on a thread)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        assert proc.stderr is not None
        threading.Thread(target=self._read, args=(proc.stderr,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait(self, pattern: str, after: int, timeout: float = 60.0) -> tuple[int, re.Match]:
        """The first line matching `pattern` from index `after` on: (index, match)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            i = after
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i])
                    if m:
                        return i, m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"no {pattern!r} in the daemon's log within {timeout} s")
                self.cond.wait(left)

    def mark(self) -> int:
        with self.cond:
            return len(self.lines)


class Worker:
    def __init__(self, root: Path, copies: int) -> None:
        self.endpoint = f"stream+ipc://{root}/w.sock"  # as the daemon's own local worker
        self.copies = copies
        self.log = (root / "worker.log").open("a")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "robotd", "serve", "robotd.demo:DotFollower"]
        argv += ["--bind", self.endpoint, "--copies", str(self.copies), "--hang-s", "5"]
        self.proc = subprocess.Popen(argv, env=child_env(), stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while self.ready() < self.copies:  # polling the worker's own heartbeat
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise BenchError("the worker's copies did not come up")
            time.sleep(0.05)

    def ping(self, episode: str | None = None) -> dict[str, Any] | None:
        """The worker's heartbeat (None: no answer within 2 s)."""
        import anyio

        from robotd.link.client import PolicyClient, PolicyError

        async def one() -> dict[str, Any] | None:
            client = PolicyClient(self.endpoint, timeout_s=2)
            try:
                await client.connect()
                return await client.ping(episode, timeout_s=2)
            except (TimeoutError, PolicyError):
                return None
            finally:
                await client.close()

        return anyio.run(one)

    def ready(self) -> int:
        got = self.ping()
        return 0 if got is None else got["pool"]["ready"] if got["pool"]["starting"] == 0 else 0

    def copy_holding_an_episode(self) -> int | None:
        got = self.ping()
        busy = [c["pid"] for c in (got or {}).get("copies", []) if c.get("episode")]
        return busy[0] if busy else None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)


def _resumed(log: Log, after: int, t_kill: int, timeout: float = 60) -> tuple[float, int]:
    _, m = log.wait(r"resumed (\{.*\})", after, timeout)
    detail = ast.literal_eval(m.group(1))
    return (detail["t_ns"] - t_kill) / 1e6, int(detail["held_ticks"])


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from robotd.operator.robotctl import ControlClient

    rng = random.Random(args.seed)
    worker = Worker(root, args.copies)
    worker.start()
    cmd = [sys.executable, "-m", "robotd", "run", "--no-status", "--worker", worker.endpoint]
    for key in (f'runtime.dir="{root}/run"', 'control.timing="realtime"', "policy.heartbeat_s=1"):
        cmd += ["--set", key]
    daemon = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    log = Log(daemon)
    resumes: list[float] = []
    holds: list[int] = []  # after a copy kill
    away_holds: list[int] = []  # after a worker restart (held while it was gone)
    try:
        log.wait(r"episode_start", 0)
        for _ in range(args.kills):
            time.sleep(rng.uniform(1.0, 2.5))  # a random moment of the episode
            pid = worker.copy_holding_an_episode()
            if pid is None:
                raise BenchError("no copy holds an episode: is the episode running?")
            mark, t_kill = log.mark(), time.monotonic_ns()
            os.kill(pid, signal.SIGKILL)
            ms, held = _resumed(log, mark, t_kill)
            resumes.append(ms)
            holds.append(held)
        client = ControlClient(f"ipc://{root}/run/control.sock", timeout_s=15)
        for away in RESTARTS_S:
            mark, t_kill = log.mark(), time.monotonic_ns()
            worker.kill()
            time.sleep(away)  # the fault's own length
            worker.start()
            log.wait(r"policy worker back after", mark)
            if away * HZ > 300:  # the watchdog ended the episode: start the next one
                log.wait(r"'outcome': 'starved'", mark)
                client.request("reset_done")
                client.request("start")
                log.wait(r"episode_start", mark)
            else:
                _, held = _resumed(log, mark, t_kill)
                away_holds.append(held)
        stats = client.request("stats")["result"]
        alive = daemon.poll() is None and client.request("status")["ok"]
        client.close()
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
        if worker.proc is not None and worker.proc.poll() is None:
            worker.proc.terminate()
            worker.proc.wait(30)
    return {
        "stats": stats,
        "resumes": resumes,
        "holds": holds,
        "away_holds": away_holds,
        "alive": alive,
    }


def _pct(values: list[float], q: float) -> float:
    import numpy as np

    return round(float(np.percentile(values, q)), 2) if values else 0.0


def _counts(by_ticks: dict[str, int]) -> str:
    return ", ".join(f"{ticks}: {n}" for ticks, n in by_ticks.items())


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    with tempfile.TemporaryDirectory(prefix="rbt-faults-") as tmp:
        got = run(args, Path(tmp))
    s = got["stats"]
    restarts = len(RESTARTS_S)
    out = {
        "kills": args.kills,
        "worker_restarts": restarts,
        "episode_resets": s["episode_resets"],
        "stale_rows_played": s["stale_rows_played"],
        "hold_after_loss_ticks_max": max(got["holds"], default=0),
        "hold_after_loss_ticks": {str(n): got["holds"].count(n) for n in sorted(set(got["holds"]))},
        "resume_ms_p50": _pct(got["resumes"], 50),
        "resume_ms_p99": _pct(got["resumes"], 99),
        "daemon_alive": bool(got["alive"]),
        "act_rtt_ms_p50": round(s["act_rtt_ms"]["p50"], 2),
        "tick_ms": round(1e3 / HZ, 2),
    }
    print_table(
        ["what", "value", "target"],
        [
            ["copies killed", out["kills"], ""],
            ["worker restarts", restarts, f"(away {', '.join(f'{a:g}' for a in RESTARTS_S)} s)"],
            ["episode resets", out["episode_resets"], f"== {args.kills + restarts}"],
            ["stale rows played", out["stale_rows_played"], "0"],
            ["held after a copy kill, ticks (max)", out["hold_after_loss_ticks_max"], "<= 1"],
            ["  ticks held: kills", _counts(out["hold_after_loss_ticks"]), ""],
            ["held while the worker was away", ", ".join(map(str, got["away_holds"])), ""],
            ["resume ms p50 / p99", f"{out['resume_ms_p50']} / {out['resume_ms_p99']}",
             f"p50 <= {out['act_rtt_ms_p50']} + 2 x {out['tick_ms']}"],
            ["daemon alive", out["daemon_alive"], "yes"],
        ],
        title=f"faults during a realtime sim run, worker --copies {args.copies}",
    )  # fmt: skip
    if args.json:
        emit_json(out)
    return 0


if __name__ == "__main__":
    run_main(main)
