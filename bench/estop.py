"""E-stop timing: from the request to the first safe command written to the joints.

    python bench/estop.py [--trials 200] [--hz 100] [--cli 20] [--json]

A real daemon on config/sim.toml at --hz (two sim cameras, the demo policy on a local
worker, realtime timing: the full sim load) runs an episode; each trial waits a random
time into it, then sends an e-stop and reads, from the acknowledgement, when the control
lane wrote its safe command (`written_ns`, CLOCK_MONOTONIC, the same clock as the sender's
on one machine); then clear_fault and start for the next. Three ways in:

  library   robotd.operator.robotctl.ControlClient: the operator socket → the main process
            → lane.sock (what `robotctl estop` does, without starting a Python process);
  lane      straight to lane.sock (robotctl's fallback when the main process hangs);
  robotctl  the command line itself (--cli trials), Python's start-up included.

Target (issue 13): the library path's p99 within one control tick (p99_ticks <= 1).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/estop.py`

from bench._common import BenchError, child_env, emit_json, print_table, run_main


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trials", type=int, default=200, help="library trials (200)")
    p.add_argument("--lane-trials", type=int, default=50, help="lane.sock trials (50)")
    p.add_argument("--cli", type=int, default=20, help="robotctl command-line trials (20)")
    p.add_argument("--hz", type=float, default=100.0, help="control rate (100)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = p.parse_args(argv)
    if args.trials < 10:
        raise BenchError(f"--trials must be >= 10, got {args.trials}")
    return args


def _pct(values: list[float], q: float) -> float:
    import numpy as np

    return round(float(np.percentile(values, q)), 3)


class Rig:
    """The daemon, and an operator client on its control socket."""

    def __init__(self, tmp: Path, hz: float) -> None:
        from robotd.operator.robotctl import ControlClient

        self.dir = tmp / "run"
        cmd = [sys.executable, "-m", "robotd", "run", "--no-status"]
        for key in (f"control.hz={hz}", 'control.timing="realtime"', f'runtime.dir="{self.dir}"'):
            cmd += ["--set", key]
        self.log = (tmp / "daemon.log").open("w")
        self.proc = subprocess.Popen(cmd, env=child_env(), stdout=self.log, stderr=self.log)
        self.endpoint = f"ipc://{self.dir}/control.sock"
        deadline = time.monotonic() + 60
        while not (self.dir / "control.sock").exists():  # no event for a file appearing
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the daemon did not come up; see {tmp / 'daemon.log'}")
            time.sleep(0.05)
        self.client = ControlClient(self.endpoint, timeout_s=10)
        self.wait_state("RUNNING")

    def request(self, cmd: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = self.client.request(cmd, args)
        if not reply.get("ok"):
            raise BenchError(f"{cmd}: {reply.get('error')}")
        return reply["result"]

    def wait_state(self, state: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.request("status").get("state") != state:
            if time.monotonic() > deadline:
                raise BenchError(f"the daemon never reached {state}")
            time.sleep(0.02)

    def running_again(self) -> None:
        self.request("clear_fault")
        self.request("start")

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def trial(rig: Rig, how: str, rng: random.Random) -> float:
    """One e-stop a random time into a running episode; ms to its safe command."""
    from robotd.operator.client import estop_via_lane

    time.sleep(rng.uniform(0.05, 0.25))  # into the episode: acts in flight, chunks playing
    t0 = time.monotonic_ns()
    if how == "library":
        written = rig.request("estop", {"reason": "bench"})["written_ns"]
    elif how == "lane":
        written = estop_via_lane(rig.endpoint, "bench", 2.0)["written_ns"]
    else:
        out = subprocess.run(
            [sys.executable, "-m", "robotd.operator.robotctl", "estop", "--json", "--endpoint",
             rig.endpoint, "--reason", "bench"],
            env=child_env(), capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            raise BenchError(f"robotctl estop exited {out.returncode}: {out.stderr.strip()}")
        written = json.loads(out.stdout.strip().splitlines()[-1])["written_ns"]
    rig.running_again()
    return (written - t0) / 1e6


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rng = random.Random(0)
    period_ms = 1e3 / args.hz
    results: dict[str, list[float]] = {"library": [], "lane": [], "robotctl": []}
    with tempfile.TemporaryDirectory(prefix="rbt-estop-") as tmp:
        rig = Rig(Path(tmp), args.hz)
        try:
            plan = ["library"] * args.trials + ["lane"] * args.lane_trials + ["robotctl"] * args.cli
            rng.shuffle(plan)  # interleaved: the machine's load falls on every way alike
            for how in plan:
                results[how].append(trial(rig, how, rng))
        finally:
            rig.close()
    rows = []
    for how, values in results.items():
        if values:
            p99 = _pct(values, 99)
            rows.append([how, len(values), _pct(values, 50), p99, round(p99 / period_ms, 2)])
    print_table(
        ["way in", "trials", "p50 ms", "p99 ms", "p99 ticks"],
        rows,
        title=f"e-stop to the first safe command written, {args.hz:g} Hz, full sim load",
        digits=3,
    )
    lib = results["library"]
    summary = {
        "trials": len(lib),
        "p50_ms": _pct(lib, 50),
        "p99_ms": _pct(lib, 99),
        "p99_ticks": round(_pct(lib, 99) / period_ms, 3),
    }
    print(f"library p99 {summary['p99_ticks']} ticks (target <= 1)")
    if args.json:
        extra = {h: {"p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99)} for h, v in results.items() if v}
        emit_json({**summary, "ways": extra})
    return 0


if __name__ == "__main__":
    run_main(main)
