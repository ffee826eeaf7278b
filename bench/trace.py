"""What tracing costs a real robot run: the control tick's lateness, the main process's CPU
and the bytes written, with tracing off, on (every tick, no frames) and with frames (those
the policy read, or every frame the cameras captured).

    python bench/trace.py [--seconds 20] [--rounds 3] [--micro-rounds 3] [--json]

Each round runs ``robotd run --config config/sim.toml --set control.timing="realtime"
--duration <seconds>`` once per variant, one after the other (never together: they would
compete for the CPUs), in an order that rotates from round to round:

  off     trace.enabled = false (the baseline)
  ticks   every tick recorded, no frames (trace.frames = false)
  policy  every tick and the frames the policy read (trace.frames = "policy": the uplink's
          224×224 JPEG, once per upload)
  all     every tick and every frame the cameras captured (trace.frames = "all": 640×480
          and 320×240 at 30 fps, JPEG-encoded by the writer thread)

Per run: ``p99_us`` the control tick's p99 lateness (the run summary's lateness_us, after
the spin tail; ``wake_p99_us`` the sleep's wake-up before it), ``main_cpu_pct`` the main
process's CPU (utime + stime from /proc/PID/stat, every thread of it, over the steady
state: from 1 s after the episode started to 1 s before the end), ``bytes_per_s`` the
trace's bytes on disk per second of recorded episode, ``writer_cpu_pct`` the writer
thread's own CPU over the run's recorded seconds and ``encode_ms`` its JPEG time per frame
it encoded (both from run.json's stats), ``frames_lost`` frames gone from a ring before
they were read, ``dropped`` records and frames a full queue dropped. The table gives each
run and the medians; ratios are against off in the same run, p99s floored at 1 µs (below that a p99
is clock-read noise). Target: ticks changes the p99 lateness by at most 10 % against off;
a p99 of a few µs varies by more than that from one untraced run to the next, so a ticks
median inside the off runs' own range also counts as met (said so, `within_off_range`).

The writer's own cost per record and per frame (the micro-bench: bench/_trace_micro.py)
comes as extra fields under "micro". With --json the last line is
``{"off": {...}, "ticks": {...}, "policy": {...}, "all": {...}, "ratios": {...},
"micro": {...}}``, each variant with p99_us, main_cpu_pct, bytes_per_s, writer_cpu_pct,
encode_ms (medians) and its runs.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/trace.py`

from bench import _trace_micro
from bench._common import (
    REPO_ROOT,
    BenchError,
    child_env,
    emit_json,
    median,
    print_table,
    ratio,
    run_main,
    tail,
)

VARIANTS: dict[str, list[str]] = {
    "off": ["trace.enabled=false"],
    "ticks": ["trace.frames=false"],
    "policy": ['trace.frames="policy"'],
    "all": ['trace.frames="all"'],
}
TRACED = ("ticks", "policy", "all")
P99_FLOOR_US = 1.0
TARGET = 1.10  # ticks' p99 lateness at most 10 % above off's
WARM_S = 1.0  # after the episode starts: start-up's work is over
COLS = ("p99_us", "p50_us", "wake_p99_us", "main_cpu_pct", "bytes_per_s", "writer_cpu_pct",
        "encode_ms")


def _cpu_s(pid: int) -> float:
    """utime + stime of every thread of `pid`, in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Lines:
    """A child's stderr read line by line on a thread (kept for error messages)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.log.append(line)
            self.q.put(line)
        self.q.put("")

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.q.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line == "":
                raise BenchError(f"robotd run exited before {text!r}:\n{tail(''.join(self.log))}")
            if text in line:
                return
        raise BenchError(f"robotd run: no {text!r} within {timeout_s:.0f} s:\n"
                         f"{tail(''.join(self.log))}")


def run_variant(name: str, seconds: float, tmp: Path) -> dict[str, Any]:
    """One `robotd run` of variant `name`: its figures (see the module docstring)."""
    summary, traces = tmp / "summary.json", tmp / "traces"
    run_dir = json.dumps(str(tmp / "run"))  # a TOML basic string
    cmd = [sys.executable, "-m", "robotd", "run", "--config", "config/sim.toml", "--no-status",
           "--set", 'control.timing="realtime"', "--set", f"runtime.dir={run_dir}",
           "--set", f"trace.dir={json.dumps(str(traces))}", "--duration", f"{seconds:g}",
           "--summary", str(summary)]  # fmt: skip
    for override in VARIANTS[name]:
        cmd += ["--set", override]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines = _Lines(proc)
    try:
        lines.wait_for("episode_start", 120)
        time.sleep(WARM_S)  # a measurement window, not synchronisation
        t1, cpu1 = time.monotonic(), _cpu_s(proc.pid)
        time.sleep(max(1.0, seconds - WARM_S - 1.0))
        t2, cpu2 = time.monotonic(), _cpu_s(proc.pid)
        code = proc.wait(seconds + 120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code != 0 or not summary.is_file():
        raise BenchError(f"robotd run ({name}) exited {code}:\n{tail(''.join(lines.log))}")
    result = json.loads(summary.read_text())
    written, recorded_s, dropped, stats = _trace_files(traces)
    encoded = int(stats.get("encoded", 0))
    lat, wake = result.get("lateness_us", {}), result.get("wake_lateness_us", {})
    return {
        "p99_us": float(lat.get("p99", 0.0)), "p50_us": float(lat.get("p50", 0.0)),
        "wake_p99_us": float(wake.get("p99", 0.0)),
        "main_cpu_pct": round((cpu2 - cpu1) / (t2 - t1) * 100, 2),
        "bytes_per_s": round(written / recorded_s) if recorded_s > 0 else 0,
        "ticks": int(result.get("ticks", 0)), "missed": int(result.get("missed_ticks", 0)),
        "dropped_records": dropped, "frames_lost": int(stats.get("frames_lost", 0)),
        "writer_cpu_pct": round(float(stats.get("writer_cpu_s", 0.0)) / recorded_s * 100, 2)
        if recorded_s > 0 else 0.0,
        "encode_ms": round(float(stats.get("encode_s", 0.0)) / encoded * 1e3, 3)
        if encoded else 0.0,
    }


def _trace_files(root: Path) -> tuple[int, float, int, dict[str, Any]]:
    """(bytes of every MCAP file, seconds of recorded episodes, records dropped, the last
    run's stats)."""
    written, seconds, dropped, stats = 0, 0.0, 0, {}
    for run in root.glob("*/") if root.is_dir() else ():
        written += sum(p.stat().st_size for p in run.glob("*.mcap"))
        for side in run.glob("episode-*.json"):
            seconds += float(json.loads(side.read_text()).get("duration_s") or 0.0)
        stats = json.loads((run / "run.json").read_text()).get("stats") or {}
        dropped += int(stats.get("dropped_records", 0)) + int(stats.get("dropped_frames", 0))
    return written, seconds, dropped, stats


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    names = list(VARIANTS)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate the order
        for name in order:
            with tempfile.TemporaryDirectory(prefix="robotd-bench-trace-") as tmp:
                got = run_variant(name, args.seconds, Path(tmp))
            runs[name].append(got)
            print(f"  round {r + 1} {name}: p99 {got['p99_us']:.1f} µs, main CPU "
                  f"{got['main_cpu_pct']:.1f} %, {got['bytes_per_s']} B/s", flush=True)
    return runs


def _medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: round(median(r[k] for r in rows), 3) for k in COLS}
    out["dropped_records"] = sum(r["dropped_records"] for r in rows)
    out["frames_lost"] = sum(r["frames_lost"] for r in rows)
    return {**out, "runs": rows}


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]],
           micro: dict[str, Any] | None) -> dict[str, Any]:
    agg = {name: _medians(rows) for name, rows in runs.items()}
    off = agg["off"]
    ratios = {
        f"p99_{n}_vs_off": ratio(agg[n]["p99_us"], off["p99_us"], floor=P99_FLOOR_US)
        for n in TRACED
    } | {
        f"cpu_{n}_vs_off": ratio(agg[n]["main_cpu_pct"], off["main_cpu_pct"]) for n in TRACED
    } | {
        "p99_all_vs_policy": ratio(agg["all"]["p99_us"], agg["policy"]["p99_us"],
                                   floor=P99_FLOOR_US),
        "cpu_all_vs_policy": ratio(agg["all"]["main_cpu_pct"], agg["policy"]["main_cpu_pct"]),
        "bytes_all_vs_policy": ratio(agg["all"]["bytes_per_s"], agg["policy"]["bytes_per_s"]),
    }
    table = [[f"{n} #{i + 1}", *(r[k] for k in COLS)] for n, rows in runs.items()
             for i, r in enumerate(rows)]
    table += [[f"{n} median", *(agg[n][k] for k in COLS)] for n in runs]
    print_table(["run", "p99 µs", "p50 µs", "wake p99 µs", "main CPU %", "bytes/s",
                 "writer CPU %", "encode ms"], table,
                title=f"tracing in a realtime sim run: {args.seconds:g} s a run, "
                      f"{args.rounds} rounds, order rotated")
    r = ratios["p99_ticks_vs_off"]
    # A p99 of a few µs moves by more than 10 % from one untraced run to the next: a median
    # inside the untraced runs' own range is no change this bench can tell from noise.
    off_high = max(row["p99_us"] for row in runs["off"])
    within = agg["ticks"]["p99_us"] <= off_high
    met = r is not None and (r <= TARGET or within)
    how = "met" if r is not None and r <= TARGET else (
        f"met: within the untraced runs' own range (up to {off_high:.1f} µs)" if within
        else "NOT met")
    print(f"p99 lateness ticks / off: {r} (target <= {TARGET}: {how}); "
          f"policy / off: {ratios['p99_policy_vs_off']}; all / off: {ratios['p99_all_vs_off']}; "
          f"main CPU ticks / off: {ratios['cpu_ticks_vs_off']}, policy / off: "
          f"{ratios['cpu_policy_vs_off']}, all / off: {ratios['cpu_all_vs_off']}")
    print(f"all / policy: p99 {ratios['p99_all_vs_policy']}, main CPU "
          f"{ratios['cpu_all_vs_policy']}, bytes {ratios['bytes_all_vs_policy']}; frames "
          f"lost from a ring: {agg['all']['frames_lost']}, dropped: "
          f"{agg['all']['dropped_records']}")
    if micro is not None:
        print(f"writer (micro-bench): tick {micro['tick_main_us']:.2f} µs on the loop, "
              f"{micro['tick_writer_us']:.2f} µs in the writer, {micro['tick_bytes']:.0f} B; "
              f"frame {micro['frame_main_us']:.2f} µs / {micro['frame_writer_us']:.0f} µs, "
              f"{micro['frame_bytes']:.0f} B")
    return {**agg, "ratios": ratios, "target": {"p99_ticks_vs_off_max": TARGET, "met": met,
                                            "within_off_range": within},
            "seconds": args.seconds, "rounds": args.rounds, "micro": micro}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="each robotd run's --duration")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--micro-rounds", type=int, default=3, help="0: no micro-bench")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.seconds < 4:
        raise BenchError("--rounds must be >= 1 and --seconds >= 4")
    micro = None
    if args.micro_rounds > 0:
        micro = _trace_micro.run(20000, 600, args.micro_rounds)
    summary = report(args, measure(args), micro)
    if args.json:
        emit_json(summary)
    return 0


if __name__ == "__main__":
    run_main(main)
