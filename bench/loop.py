"""Control-loop lateness: a bare loop alone vs robotd's control process under full load.

    python bench/loop.py [--hz 100] [--seconds 20] [--spin-us 200] [--repeat 2] [--json]

Each repeat runs, one after the other (never together: they would compete for the CPUs):
1. robotd: ``python -m robotd run --config config/sim.toml --set control.hz=<hz>
   --set control.spin_us=<spin> --set runtime.dir="<tmp>" --duration <s> --summary
   <file>`` runs the whole sim pipeline (cameras, worker, uploads) in a run directory of
   its own and writes its control lane's lateness summary;
2. baseline: a child Python process runs the same Ticker with the same spin tail and
   the same realtime settings (SCHED_FIFO priority and mlockall from the config's
   [control] table, gc.freeze) and nothing else, recording each tick's lateness.

Like with like: the control lane ticks from its start, through the daemon's start-up
(worker and cameras spawning) and --seconds of running, to the stop, and its summary
covers all of it; so the baseline after it runs for the same number of deadlines
(robotd's ticks + missed), not just --seconds.

Two latenesses per tick: ``lateness`` is measured when the loop resumes, after the spin
tail, which hides any wake-up earlier than the deadline (so both p99s sit near the
clock-read cost, ~1 µs); ``wake`` is how late the kernel woke the sleep (the clock
right after the sleep returned minus deadline - spin), which the spin tail absorbs
while it is under --spin-us. robotd reports wake lateness when its summary has
``wake_lateness_us``; "-" otherwise.

Output: a row per run, then the medians of the per-run percentiles (max: the largest;
missed and ticks: the totals over the runs), the ratio robotd / baseline of the median
p99s with both floored at 1 µs (below that a p99 is clock-read noise) and, with --json,
a last line ``{"hz", "seconds", "robotd": {"p50_us", "p99_us", "p999_us", "max_us",
"missed", ...}, "baseline": {same}, "p99_ratio", ...}`` (robotd/baseline hold the
medians; extra keys: ticks, wake_*_us, p99_floor_us, wake_p99_ratio, repeat, runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/loop.py`

from bench._common import (
    REPO_ROOT,
    BenchError,
    emit_json,
    median,
    print_table,
    ratio,
    run_json_child,
    run_logged,
    run_main,
    tail,
)

DEFAULT_CONFIG = "config/sim.toml"
P99_FLOOR_US = 1.0  # a p99 below this is clock-read noise: ratios use max(p99, floor)
_KEYS = ("p50", "p99", "p999", "max")
_WAKE_KEYS = ("p50", "p99", "max")

Row = dict[str, float | int]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hz", type=float, default=100.0, help="control rate (default 100)")
    p.add_argument("--seconds", type=float, default=20.0, help="robotd's --duration (default 20)")
    p.add_argument("--spin-us", type=int, default=200, help="spin tail in µs (default 200)")
    p.add_argument("--repeat", type=int, default=2, help="robotd/baseline pairs (default 2)")
    p.add_argument(
        "--config", default=DEFAULT_CONFIG, help=f"robotd config (default {DEFAULT_CONFIG})"
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--baseline-only", action="store_true", help="skip the robotd runs")
    # internal: run the bare loop in this process over --deadlines and print its JSON summary
    p.add_argument("--baseline-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--deadlines", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--priority", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--lock-memory", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 0 < args.hz <= 2000:
        p.error(f"--hz must be in (0, 2000], got {args.hz}")
    if not args.seconds > 0:
        p.error(f"--seconds must be > 0, got {args.seconds}")
    if not 0 <= args.spin_us <= 5000:
        p.error(f"--spin-us must be in 0..5000 (robotd's control.spin_us), got {args.spin_us}")
    if args.repeat < 1:
        p.error(f"--repeat must be >= 1, got {args.repeat}")
    return args


def baseline_child(hz: float, deadlines: int, spin_us: int, priority: int, lock: bool) -> None:
    """The bare loop over ``deadlines`` deadlines: Ticker + spin tail + rt settings, both
    latenesses into histograms, JSON out."""
    from robotd.control.histogram import LatencyHistogram
    from robotd.control.rt import describe_scheduling, enable_realtime, freeze_gc
    from robotd.control.ticker import Ticker

    warnings = enable_realtime(priority, lock)
    ticker = Ticker.from_hz(hz, spin_ns=spin_us * 1000)
    hist, wake = LatencyHistogram(), LatencyHistogram()
    freeze_gc()
    ticker.start()
    while ticker.ticks + ticker.missed < deadlines:
        tick = ticker.wait()
        hist.add(tick.lateness_ns)
        if tick.sleep_lateness_ns is not None:
            wake.add(tick.sleep_lateness_ns)
    out = {
        "lateness_us": hist.summary(),
        "wake_lateness_us": wake.summary(),
        "missed_ticks": ticker.missed,
        "ticks": ticker.ticks,
        "scheduling": describe_scheduling(),
        "warnings": warnings,
    }
    print(json.dumps(out), flush=True)


def rt_settings(config: Path) -> tuple[int, bool]:
    """(rt_priority, lock_memory) from the config's [control] table, robotd's defaults else."""
    try:
        data = tomllib.loads(config.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BenchError(f"{config}: cannot read the config: {exc}") from exc
    control = data.get("control", {})
    priority = control.get("rt_priority", 80)
    lock = control.get("lock_memory", True)
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 99:
        raise BenchError(f"{config}: control.rt_priority must be an int 0..99, got {priority!r}")
    if not isinstance(lock, bool):
        raise BenchError(f"{config}: control.lock_memory must be true or false, got {lock!r}")
    return priority, lock


def run_baseline(
    args: argparse.Namespace, deadlines: int, priority: int, lock: bool
) -> dict[str, Any]:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--baseline-child",
        "--hz", f"{args.hz:g}", "--deadlines", str(deadlines), "--spin-us", str(args.spin_us),
        "--priority", str(priority),
    ]  # fmt: skip
    if lock:
        cmd.append("--lock-memory")
    seconds = deadlines / args.hz
    result = run_json_child(cmd, timeout_s=seconds * 1.5 + 30, what="baseline loop")
    for warning in result.get("warnings", []):
        print(f"baseline: warning: {warning}", file=sys.stderr)
    return result


def check_daemon_available(config: Path) -> None:
    """BenchError unless ``python -m robotd`` and the config exist."""
    if importlib.util.find_spec("robotd.__main__") is None:
        raise BenchError(
            "robotd has no `python -m robotd` entry point yet (robotd/__main__.py is missing): "
            "cannot measure the daemon; use --baseline-only to measure the bare loop alone"
        )
    if not config.is_file():
        raise BenchError(f"{config}: config file not found")


def run_robotd(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Run the daemon for --seconds in its own run directory; return its --summary JSON."""
    summary = tmp / "summary.json"
    log = tmp / "robotd.log"
    run_dir = tmp / "run"
    cmd = [
        sys.executable, "-m", "robotd", "run", "--config", args.config,
        "--set", f"control.hz={args.hz:g}", "--set", f"control.spin_us={args.spin_us}",
        "--set", f"runtime.dir={json.dumps(str(run_dir))}",  # a TOML basic string
        "--duration", f"{args.seconds:g}", "--summary", str(summary), "--no-status",
        "--set", "trace.enabled=false",  # the loop alone (bench/trace.py measures the trace)
    ]  # fmt: skip
    # start-up (worker, cameras) and shutdown come on top of --seconds
    run_logged(cmd, timeout_s=args.seconds + 120, log=log, what="robotd run")
    if not summary.is_file():
        text = log.read_text(errors="replace")
        raise BenchError(f"robotd run wrote no --summary file {summary}; log:\n{tail(text)}")
    try:
        data = json.loads(summary.read_text())
    except json.JSONDecodeError as exc:
        raise BenchError(f"robotd summary {summary}: not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BenchError(f"robotd summary {summary}: expected a JSON object, got {data!r:.200}")
    return data


def _number(obj: dict[str, Any], key: str, what: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BenchError(f"{what}.{key} must be a number, got {value!r}")
    return round(float(value), 3)


def _count(result: dict[str, Any], key: str, what: str) -> int:
    value = result.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BenchError(f"{what}: {key} must be an int, got {value!r}")
    return value


def row(result: dict[str, Any], what: str) -> Row:
    """One run's ``{p50_us, p99_us, p999_us, max_us, missed, ticks}``, plus
    ``wake_{p50,p99,max}_us`` when the summary has ``wake_lateness_us``; validated."""
    lat = result.get("lateness_us")
    if not isinstance(lat, dict):
        raise BenchError(f"{what}: summary has no lateness_us object: {result!r:.200}")
    out: Row = {f"{k}_us": _number(lat, k, f"{what}: lateness_us") for k in _KEYS}
    out["missed"] = _count(result, "missed_ticks", what)
    out["ticks"] = _count(result, "ticks", what)
    wake = result.get("wake_lateness_us")
    if isinstance(wake, dict):
        for k in _WAKE_KEYS:
            out[f"wake_{k}_us"] = _number(wake, k, f"{what}: wake_lateness_us")
    return out


def aggregate(rows: list[Row]) -> Row:
    """Medians of the per-run percentiles, the largest max, the total of missed and ticks."""
    out: Row = {}
    for key in rows[0]:
        values = [r[key] for r in rows if key in r]
        if key in ("missed", "ticks"):
            out[key] = int(sum(values))
        elif key.endswith("max_us"):
            out[key] = max(values)
        else:
            out[key] = round(median(values), 3)
    return out


def measure(
    args: argparse.Namespace, priority: int, lock: bool
) -> tuple[dict[str, list[Row]], str]:
    """Alternate robotd and a matching baseline --repeat times; per-run rows by name, and
    the baseline's scheduling (what realtime settings took effect)."""
    runs: dict[str, list[Row]] = {"robotd": [], "baseline": []}
    scheduling = "?"
    for n in range(1, args.repeat + 1):
        deadlines = max(1, round(args.seconds * args.hz))
        if not args.baseline_only:
            with tempfile.TemporaryDirectory(prefix="robotd-bench-loop-") as tmp:
                robot = row(run_robotd(args, Path(tmp)), f"robotd summary (run {n})")
            runs["robotd"].append(robot)
            deadlines = int(robot["ticks"]) + int(robot["missed"])  # the lane's whole life
            _progress("robotd", n, robot)
        raw = run_baseline(args, deadlines, priority, lock)
        runs["baseline"].append(row(raw, f"baseline loop (run {n})"))
        _progress("baseline", n, runs["baseline"][-1])
        scheduling = str(raw.get("scheduling", "?"))
    return runs, scheduling


def _progress(name: str, n: int, r: Row) -> None:
    print(f"  run {n} {name}: p99 {r['p99_us']:.1f} µs, {r['ticks']} ticks", flush=True)


def report(args: argparse.Namespace, runs: dict[str, list[Row]], scheduling: str) -> dict[str, Any]:
    """Print the table and the ratios; return the JSON summary."""
    names = [name for name in ("robotd", "baseline") if runs[name]]
    agg = {name: aggregate(runs[name]) for name in names}
    headers = ["run", "p50 µs", "p99 µs", "p999 µs", "max µs", "missed", "ticks"]
    headers += [f"wake {k} µs" for k in _WAKE_KEYS]
    keys = [*(f"{k}_us" for k in _KEYS), "missed", "ticks", *(f"wake_{k}_us" for k in _WAKE_KEYS)]
    table = []
    for n in range(args.repeat):
        table += [[f"{name} #{n + 1}", *(runs[name][n].get(k) for k in keys)] for name in names]
    table += [[f"{name} median", *(agg[name].get(k) for k in keys)] for name in names]
    print_table(headers, table, title=f"control-loop lateness, µs ({scheduling})")
    robot, base = agg.get("robotd"), agg["baseline"]
    p99_ratio = ratio(robot["p99_us"], base["p99_us"], floor=P99_FLOOR_US) if robot else None
    wake_ratio = None
    if robot and "wake_p99_us" in robot:
        wake_ratio = ratio(robot["wake_p99_us"], base["wake_p99_us"], floor=P99_FLOOR_US)
    print(
        f"median p99 ratio robotd / baseline (each floored at {P99_FLOOR_US:g} µs): "
        f"after spin {_fmt_ratio(p99_ratio)}, wake {_fmt_ratio(wake_ratio)}"
    )
    return {
        "hz": args.hz,
        "seconds": args.seconds,
        "robotd": robot,
        "baseline": base,
        "p99_ratio": p99_ratio,
        "p99_floor_us": P99_FLOOR_US,
        "wake_p99_ratio": wake_ratio,
        "repeat": args.repeat,
        "runs": {name: runs[name] for name in names},
    }


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.baseline_child:
        baseline_child(args.hz, args.deadlines, args.spin_us, args.priority, args.lock_memory)
        return 0
    config = (REPO_ROOT / args.config).resolve()
    priority, lock = rt_settings(config)
    if not args.baseline_only:
        check_daemon_available(config)  # fail before spending minutes
    print(
        f"loop bench: {args.hz:g} Hz, {args.seconds:g} s per robotd run, {args.repeat} "
        f"repeat(s), spin {args.spin_us} µs, SCHED_FIFO {priority or 'off'}, "
        f"mlockall {'on' if lock else 'off'}",
        flush=True,
    )
    summary = report(args, *measure(args, priority, lock))
    if args.json:
        emit_json(summary)
    return 0


if __name__ == "__main__":
    run_main(main)
