"""Control-loop lateness: a bare loop alone vs robotd's control process under full load.

    python bench/loop.py [--hz 100] [--seconds 20] [--spin-us 200] [--json]

1. baseline: a child Python process runs the same Ticker with the same spin tail and
   the same realtime settings (SCHED_FIFO priority and mlockall from the config's
   [control] table, gc.freeze) and nothing else, recording each tick's lateness;
2. robotd: ``python -m robotd run --config config/sim.toml --set control.hz=<hz>
   --duration <s> --summary <file>`` runs the whole sim pipeline (cameras, worker,
   uploads) and writes its control lane's lateness summary.

The baseline runs first and alone, for the same duration. Output: a table (p50, p99,
p99.9, max lateness in µs, missed deadlines), the ratio robotd p99 / baseline p99 and,
with --json, a last line ``{"hz", "seconds", "robotd": {...}, "baseline": {...},
"p99_ratio"}``.
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
    print_table,
    ratio,
    run_json_child,
    run_logged,
    run_main,
    tail,
)

DEFAULT_CONFIG = "config/sim.toml"
_KEYS = ("p50", "p99", "p999", "max")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hz", type=float, default=100.0, help="control rate (default 100)")
    p.add_argument("--seconds", type=float, default=20.0, help="duration of each run (default 20)")
    p.add_argument("--spin-us", type=int, default=200, help="spin tail in µs (default 200)")
    p.add_argument(
        "--config", default=DEFAULT_CONFIG, help=f"robotd config (default {DEFAULT_CONFIG})"
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--baseline-only", action="store_true", help="skip the robotd run")
    # internal: run the bare loop in this process and print its JSON summary
    p.add_argument("--baseline-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--priority", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--lock-memory", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 0 < args.hz <= 2000:
        p.error(f"--hz must be in (0, 2000], got {args.hz}")
    if not args.seconds > 0:
        p.error(f"--seconds must be > 0, got {args.seconds}")
    if args.spin_us < 0:
        p.error(f"--spin-us must be >= 0, got {args.spin_us}")
    return args


def baseline_child(hz: float, seconds: float, spin_us: int, priority: int, lock: bool) -> None:
    """The bare loop: Ticker + spin tail + rt settings, lateness into a histogram, JSON out."""
    from robotd.control.histogram import LatencyHistogram
    from robotd.control.rt import describe_scheduling, enable_realtime, freeze_gc
    from robotd.control.ticker import Ticker

    warnings = enable_realtime(priority, lock)
    ticker = Ticker.from_hz(hz, spin_ns=spin_us * 1000)
    hist = LatencyHistogram()
    n_ticks = max(1, round(seconds * hz))
    freeze_gc()
    ticker.start()
    for _ in range(n_ticks):
        tick = ticker.wait()
        hist.add(tick.lateness_ns)
    out = {
        "lateness_us": hist.summary(),
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


def run_baseline(args: argparse.Namespace, priority: int, lock: bool) -> dict[str, Any]:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--baseline-child",
        "--hz", f"{args.hz:g}", "--seconds", f"{args.seconds:g}", "--spin-us", str(args.spin_us),
        "--priority", str(priority),
    ]  # fmt: skip
    if lock:
        cmd.append("--lock-memory")
    result = run_json_child(cmd, timeout_s=args.seconds * 1.5 + 30, what="baseline loop")
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
    """Run the daemon for --seconds and return its --summary JSON."""
    summary = tmp / "summary.json"
    log = tmp / "robotd.log"
    cmd = [
        sys.executable, "-m", "robotd", "run", "--config", args.config,
        "--set", f"control.hz={args.hz:g}", "--duration", f"{args.seconds:g}",
        "--summary", str(summary),
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


def row(result: dict[str, Any], what: str) -> dict[str, float | int]:
    """The JSON row ``{p50_us, p99_us, p999_us, max_us, missed}``, validating the input."""
    lat = result.get("lateness_us")
    if not isinstance(lat, dict):
        raise BenchError(f"{what}: summary has no lateness_us object: {result!r:.200}")
    out: dict[str, float | int] = {}
    for key in _KEYS:
        value = lat.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BenchError(f"{what}: lateness_us.{key} must be a number, got {value!r}")
        out[f"{key}_us"] = round(float(value), 3)
    missed = result.get("missed_ticks")
    if isinstance(missed, bool) or not isinstance(missed, int):
        raise BenchError(f"{what}: missed_ticks must be an int, got {missed!r}")
    out["missed"] = missed
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.baseline_child:
        baseline_child(args.hz, args.seconds, args.spin_us, args.priority, args.lock_memory)
        return 0
    config = (REPO_ROOT / args.config).resolve()
    priority, lock = rt_settings(config)
    if not args.baseline_only:
        check_daemon_available(config)  # fail before spending --seconds on the baseline
    print(
        f"loop bench: {args.hz:g} Hz, {args.seconds:g} s per run, spin {args.spin_us} µs, "
        f"SCHED_FIFO {priority or 'off'}, mlockall {'on' if lock else 'off'}",
        flush=True,
    )
    raw_base = run_baseline(args, priority, lock)
    base = row(raw_base, "baseline loop")
    robot: dict[str, float | int] | None = None
    ticks: dict[str, Any] = {"baseline": raw_base.get("ticks")}
    if not args.baseline_only:
        with tempfile.TemporaryDirectory(prefix="robotd-bench-loop-") as tmp:
            raw_robot = run_robotd(args, Path(tmp))
        robot = row(raw_robot, "robotd summary")
        ticks["robotd"] = raw_robot.get("ticks")
    headers = ["run", "p50 µs", "p99 µs", "p999 µs", "max µs", "missed", "ticks"]
    rows = [["baseline", *(base[f"{k}_us"] for k in _KEYS), base["missed"], ticks["baseline"]]]
    if robot is not None:
        rows.append(
            ["robotd", *(robot[f"{k}_us"] for k in _KEYS), robot["missed"], ticks["robotd"]]
        )
    print_table(headers, rows, title=f"control-loop lateness ({raw_base.get('scheduling')})")
    p99_ratio = ratio(robot["p99_us"], base["p99_us"]) if robot else None
    print(f"p99 ratio robotd / baseline: {'-' if p99_ratio is None else f'{p99_ratio:.2f}'}")
    if args.json:
        emit_json({"hz": args.hz, "seconds": args.seconds, "robotd": robot,
                   "baseline": base, "p99_ratio": p99_ratio})  # fmt: skip
    return 0


if __name__ == "__main__":
    run_main(main)
