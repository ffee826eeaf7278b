"""Realtime chunk merging on the sim tracking task, on the virtual clock (no wall time).

    python bench/merge.py [--steps 600] [--sampled SIGMA] [--json]

The demo policy (robotd.demo:DotFollower, its own latency_ms = 0 so it never sleeps) follows
the dot of config/sim.toml's world; the policy latency is fixed by the virtual clock at 0, 50,
100, 200 and 400 ms (robotd.virtual.run_virtual), and once more at 200 ms jittering uniformly
by ±50% act by act (robotd.virtual.latency.jittered, seeded), for seven ways of playing its
chunks:

  sync      the world waits for every act (latency costs nothing but wall time);
  naive     realtime without latency drop: a chunk plays from its first row, late;
  replace   realtime, aligned: rows for steps already past are dropped, the rest replaces;
  fade      aligned, and the seam's offset blended out over fade_steps (grippers skipped);
  ensemble  aligned, ACT-style exponential average of the overlapping chunks;
  rtc       aligned, real-time chunking: each act hands the policy its frozen prefix and
            predicted delay, DotFollower(rtc=True) continues the prefix and blends into its
            own plan, and the robot keeps the prefix whatever the answer;
  auto      replace with control.refill_steps = "auto": ask when the rows left fall to the
            measured delay plus a margin, instead of at a fixed refill_steps.

Per run: tracking error (tip to dot, world units) mean and p95, holds (all, the first chunk's
wait included), holds after the first chunk (ticks with no row to play: the queue ran dry),
the largest per-tick joint jump (rad) and the mean absolute jerk (rad/s³, arm joints; grippers
excluded), and delay overruns (answers later than their act's predicted delay; the run's first
act is predicted at 1 step, with nothing measured yet). Targets: at 200 ms replace's
tracking_mean <= 0.6 x naive's and fade's max_jump below replace's (issue 4); rtc's max_jump
<= fade's and its tracking_mean <= replace's, auto: no hold after the first chunk at any
latency up to 400 ms (issue 11). A second table runs rtc at 200 ms for several of
DotFollower's blend bounds (blend_step), beside replace and fade: how much tracking each
smoother seam costs; with --json it is "rtc_frontier", one row per bound. A third runs
replace, fade and rtc at 200 ms at the table's refill_steps and asked back to back
(refill_steps = horizon - 1: an act is asked as soon as the last answer lands, as the RTC
paper's inference loop does): fresher plans track better in every mode, and rtc and fade
keep the more frequent seams small; with --json it is "back_to_back". A fourth runs replace,
fade and rtc at 200 ms with the shield config/sim.toml deploys (safety.max_velocity): how
many ticks it rate-limits, and what that does to tracking; with --json "with_shield". Every
result row also carries the shield's `clipped` (into the position limits) and `clamped`
(rate limited) counts.

Choices, and why (every run uses the same ones, so the table compares merging alone):
  - horizon 30 rows (1 s at 30 Hz) and refill_steps 14 for every realtime mode but auto: the
    next act is asked while 14 rows remain, which covers the largest latency (400 ms = 12
    steps) with 2 to spare, so the queue never runs dry after the first chunk and the figures
    are about merging, not starving; auto shows what asking by the measured delay does instead
    (it asks later, so it plays older rows of each chunk);
  - fade_steps 5 (the config default), the delay prediction's defaults (quantile 0.9, margin 1);
  - no per-tick velocity limit in the shield (safety.max_velocity unset): the jump measured is
    the merge's own seam, not the shield's clamp; the position limits stay;
  - 600 steps (20 s): one full period of the dot's path;
  - the demo's plan exact (no --sampled): every chunk is the same plan, only fresher. With
    --sampled SIGMA each act draws a sample instead, as a diffusion or flow-matching policy
    does: its plan off by a smooth random deviation of RMS SIGMA rad per row (an offset and
    two slow waves across the chunk; DotFollower's sample_noise, seeded by --seed), so
    consecutive chunks disagree; rtc still answers the prefix it is handed, then blends into
    its own new sample. Every table runs so; the JSON's "parameters" says which.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/merge.py`

from bench._common import BenchError, emit_json, print_table, ratio, run_main

MODES = ("sync", "naive", "replace", "fade", "ensemble", "rtc", "auto")
LATENCIES_MS = (0, 50, 100, 200, 400)
JITTER = (200, 0.5)  # the jittered run: latency ms, uniform spread (±50%)
# rtc's trade at 200 ms: the blend's bound per row, up to one that removes any seam at once
FRONTIER = (0.015, 0.03, 0.05, 0.08, 0.12, 10.0)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=600, help="control ticks per run (default 600)")
    p.add_argument("--horizon", type=int, default=30, help="demo policy rows per chunk (30)")
    p.add_argument("--refill-steps", type=int, default=14, help="realtime refill_steps (14)")
    p.add_argument("--fade-steps", type=int, default=5, help="fade_steps (5)")
    p.add_argument("--seed", type=int, default=0, help="sim noise, jitter and sampling seed (0)")
    p.add_argument("--sampled", type=float, default=0.0, metavar="SIGMA",
                   help="each chunk a sample RMS SIGMA rad off the exact plan (0: exact)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = p.parse_args(argv)
    for name in ("steps", "horizon", "fade_steps"):
        if getattr(args, name) < 1:
            raise BenchError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.refill_steps < 0:
        raise BenchError(f"--refill-steps must be >= 0, got {args.refill_steps}")
    if not (math.isfinite(args.sampled) and args.sampled >= 0):
        raise BenchError(f"--sampled must be finite and >= 0, got {args.sampled}")
    return args


def _config(mode: str, args: argparse.Namespace, shield: bool = False) -> Any:
    """The mode's config on config/sim.toml's defaults; the shield's per-tick velocity
    limit taken out unless `shield` (the deployment's, as config/sim.toml sets it)."""
    from robotd.config import load_config
    from robotd.errors import ConfigError

    refill = '"auto"' if mode == "auto" else str(args.refill_steps)
    overrides = [
        f"control.refill_steps={refill}",
        f"control.fade_steps={args.fade_steps}",
        'control.timing="sync"' if mode == "sync" else 'control.timing="realtime"',
    ]
    if mode in ("fade", "ensemble"):
        overrides.append(f'control.merge="{mode}"')
    try:
        cfg = load_config(None, overrides)
    except ConfigError as exc:
        raise BenchError(f"config for mode {mode}: {exc}") from None
    if shield:
        return cfg
    return cfg.model_copy(update={"safety": cfg.safety.model_copy(update={"max_velocity": None})})


def run_one(
    mode: str,
    latency_ms: int,
    jitter: float,
    args: argparse.Namespace,
    blend_step: float | None = None,
    shield: bool = False,
) -> dict[str, Any]:
    """One virtual run; the result row of the JSON line (`shield`: with the deployment's
    velocity limit)."""
    from robotd.demo import DotFollower
    from robotd.virtual.latency import jittered
    from robotd.virtual.runner import run_virtual

    latency: Any = latency_ms / 1e3
    if jitter:
        latency = jittered(latency, jitter, seed=args.seed)
    # blend_step: the most of a seam's offset removed per row (None: DotFollower's own)
    bound = {} if blend_step is None else {"blend_step": blend_step}
    policy = DotFollower(
        latency_ms=0,
        horizon=args.horizon,
        rtc=mode == "rtc",
        sample_noise=args.sampled,
        seed=args.seed,
        **bound,
    )
    result = run_virtual(
        _config(mode, args, shield),
        policy,
        steps=args.steps,
        latency_s=latency,
        seed=args.seed,
        aligned=mode != "naive",
    )
    if result.outcome:
        raise BenchError(
            f"{mode} at {latency_ms} ms: the episode ended early ({result.outcome}); "
            f"events: {result.events[-3:]}"
        )
    return {
        "mode": mode,
        "latency_ms": latency_ms,
        "jitter": jitter,
        "tracking_mean": round(result.tracking_mean, 5),
        "tracking_p95": round(result.tracking_p95, 5),
        "holds": result.holds,
        "holds_after_first": result.holds_after_first,
        "max_jump": round(result.max_jump, 5),
        "mean_abs_jerk": round(result.mean_abs_jerk, 2),
        "delay_overruns": result.counters["delay_overruns"],
        "clipped": result.counters["clipped"],  # the shield: into the position limits
        "clamped": result.counters["clamped"],  # the shield: rate limited
    }


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _verdict(results: list[dict[str, Any]]) -> list[str]:
    at = {r["mode"]: r for r in results if r["latency_ms"] == 200 and not r["jitter"]}
    share = ratio(at["replace"]["tracking_mean"], at["naive"]["tracking_mean"])
    jump_ok = at["fade"]["max_jump"] < at["replace"]["max_jump"]
    rtc, fade, rep = at["rtc"], at["fade"], at["replace"]
    auto = [r["holds_after_first"] for r in results if r["mode"] == "auto" and not r["jitter"]]
    return [
        f"at 200 ms: replace / naive tracking_mean = {share} "
        f"({_met(share is not None and share <= 0.6)}: target <= 0.6)",
        f"at 200 ms: fade max_jump {fade['max_jump']:.4f} vs replace "
        f"{rep['max_jump']:.4f} ({_met(jump_ok)}: target below)",
        f"at 200 ms: rtc max_jump {rtc['max_jump']:.4f} vs fade {fade['max_jump']:.4f} "
        f"({_met(rtc['max_jump'] <= fade['max_jump'])}: target <=)",
        f"at 200 ms: rtc tracking_mean {rtc['tracking_mean']:.4f} vs replace "
        f"{rep['tracking_mean']:.4f} ({_met(rtc['tracking_mean'] <= rep['tracking_mean'])}: "
        "target <=)",
        f"auto: holds after the first chunk at {', '.join(map(str, LATENCIES_MS))} ms: "
        f"{auto} ({_met(not any(auto))}: target 0 at each)",
    ]


def _frontier(args: argparse.Namespace, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """rtc at 200 ms for each blend bound in FRONTIER, beside replace and fade: what a
    smoother seam costs in tracking, printed."""
    rows = [
        {"blend_step": b, **run_one("rtc", 200, 0.0, args, blend_step=b)} for b in FRONTIER
    ]
    at = {r["mode"]: r for r in results if r["latency_ms"] == 200 and not r["jitter"]}
    table = [
        [f"rtc, blend_step {r['blend_step']:g}", r["tracking_mean"], r["max_jump"]] for r in rows
    ]
    table += [[m, at[m]["tracking_mean"], at[m]["max_jump"]] for m in ("replace", "fade")]
    print_table(
        ["at 200 ms", "tracking mean", "max jump (rad)"],
        table,
        title="rtc's seam against its tracking (blend_step: the most of the seam's offset "
        "DotFollower removes per row)",
        digits=4,
    )
    if args.sampled:
        print(
            f"Each chunk is a fresh sample (RMS {args.sampled:g} rad off the exact plan): a "
            "slower blend keeps more of the previous sample; with no blend rtc is replace."
        )
    else:
        print(
            "The demo's plan is exact and noise-free: after the frozen prefix the freshest "
            "plan (replace) tracks best, so any blend costs tracking; with no blend rtc is "
            "replace."
        )
    return rows


def _back_to_back(args: argparse.Namespace) -> list[dict[str, Any]]:
    """replace, fade and rtc at 200 ms asked back to back (refill_steps = horizon - 1: the
    next act is asked as soon as an answer lands), beside the table's refill_steps: what
    re-planning more often buys each, printed."""
    early = argparse.Namespace(**{**vars(args), "refill_steps": max(0, args.horizon - 1)})
    rows = [
        {"refill_steps": a.refill_steps, **run_one(m, 200, 0.0, a)}
        for a in (args, early)
        for m in ("replace", "fade", "rtc")
    ]
    keys = ("mode", "refill_steps", "tracking_mean", "max_jump")
    print_table(
        ["at 200 ms", "refill_steps", "tracking mean", "max jump (rad)", "jerk (rad/s³)"],
        [[*(r[k] for k in keys), f"{r['mean_abs_jerk']:.1f}"] for r in rows],
        title="asked back to back: fresher plans for every mode; the seams are more, smaller",
        digits=4,
    )
    return rows


def _shielded(args: argparse.Namespace) -> list[dict[str, Any]]:
    """replace, fade and rtc at 200 ms with the shield config/sim.toml deploys (its
    safety.max_velocity): the ticks it rate-limits, and what that does to tracking, printed."""
    rows = [run_one(m, 200, 0.0, args, shield=True) for m in ("replace", "fade", "rtc")]
    keys = ("mode", "tracking_mean", "max_jump", "clamped", "clipped")
    print_table(
        ["at 200 ms", "tracking mean", "max jump (rad)", "rate limited", "clipped"],
        [[r[k] for k in keys] for r in rows],
        title="with the deployment's shield (config/sim.toml's safety.max_velocity): the "
        "ticks it rate-limits (clamped) and clips into the position limits",
        digits=4,
    )
    return rows


def _parameters(args: argparse.Namespace) -> dict[str, Any]:
    """The run's choices, for the JSON line: sampled is the chunks' sampling RMS (0: exact)."""
    keys = ("steps", "horizon", "refill_steps", "fade_steps", "seed", "sampled")
    return {k: getattr(args, k) for k in keys}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    runs = [(ms, 0.0) for ms in LATENCIES_MS] + [JITTER]
    results = [run_one(mode, ms, jit, args) for mode in MODES for ms, jit in runs]
    print_table(
        [
            "mode",
            "latency ms",
            "tracking mean",
            "tracking p95",
            "holds",
            "after first",
            "max jump (rad)",
            "jerk (rad/s³)",
            "overruns",
        ],
        [
            [
                r["mode"],
                f"{r['latency_ms']}" + (f" ±{r['jitter']:.0%}" if r["jitter"] else ""),
                r["tracking_mean"],
                r["tracking_p95"],
                r["holds"],
                r["holds_after_first"],
                r["max_jump"],
                f"{r['mean_abs_jerk']:.1f}",
                r["delay_overruns"],
            ]
            for r in results
        ],
        title=f"merge: {args.steps} ticks per run, horizon {args.horizon}, "
        f"refill_steps {args.refill_steps} (auto: measured), fade_steps {args.fade_steps} "
        + (f"(virtual clock), sampled chunks: RMS {args.sampled:g} rad, seed {args.seed}"
           if args.sampled else "(virtual clock)"),
        digits=4,
    )
    for line in _verdict(results):
        print(line)
    frontier = _frontier(args, results)
    early = _back_to_back(args)
    shielded = _shielded(args)
    runs_done = len(results) + len(frontier) + len(early) + len(shielded)
    print(f"({runs_done} runs in {time.perf_counter() - started:.1f} s)")
    if args.json:
        emit_json({"results": results, "rtc_frontier": frontier, "back_to_back": early,
                   "with_shield": shielded, "parameters": _parameters(args)})
    return 0


if __name__ == "__main__":
    run_main(main)
