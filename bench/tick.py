"""The control lane's own work per tick, and the control process's memory.

    python bench/tick.py [--ticks 20000] [--repeat 5] [--seconds 8] [--json]

1. Per tick (µs, p50/p99 over --ticks ticks, config/sim.toml), on a real ControlLane:
   - tick: the lane's own work, kernel.update (step s recorded, a chunk merged when one
     arrived, an ask when the queue runs low, the row popped or the hold, the shield) and
     the encoding of what the tick emitted (the Step and any Ask/Merged/Event);
   - loop: everything between two deadlines, minus the sleep: draining the inbound socket
     (a chunk arrives as a real ChunkRows message on ipc whenever the lane asked), reading
     the sim arm (its simulation included), the camera rings' newest frame references,
     kernel.update, the write, and the send (one message a tick).
   The stats message (built and encoded, every stats interval) is timed apart. The lane is
   timed --repeat times (a fresh lane each time) and the medians of the runs' p50 and p99
   are quoted, each run's figures beside them: one run's p99 on a shared machine moves by
   a quarter from one run to the next. The camera
   rings are advanced by the bench between ticks (their headers, not their pixels: the
   camera processes write those, on their own time).
2. The per-tick Step message, encoded and decoded: msgspec Structs (what the lane uses)
   against msgpack with dicts (what it used before), measured in the same run.
3. The control process's resident and locked memory (VmRSS, VmLck from /proc) in a real
   `robotd run` on config/sim.toml, after --seconds.

Targets (issue 7): tick p99 <= 50 µs; control RSS <= 100 MB and VmLck <= 120 MB.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/tick.py`

from bench._common import BenchError, child_env, emit_json, print_table, ratio, run_main


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ticks", type=int, default=20_000, help="ticks timed (>= 10000 for the issue)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs; medians are quoted")
    p.add_argument("--seconds", type=float, default=8.0, help="the real run's length for memory")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = p.parse_args(argv)
    if args.ticks < 100:
        raise BenchError(f"--ticks must be >= 100, got {args.ticks}")
    if args.repeat < 1:
        raise BenchError(f"--repeat must be >= 1, got {args.repeat}")
    return args


def _pct(values: list[float], q: float) -> float:
    import numpy as np

    return round(float(np.percentile(values, q)), 2)


def _lane(tmp: Path) -> tuple[Any, Any, Any, dict[str, Any]]:
    """A real ControlLane on config/sim.toml (its own sockets in `tmp`), the main side's
    sockets, and the camera rings (written by the bench, as camera processes would)."""
    import zmq

    from robotd.config import load_config
    from robotd.control.ports import ControlSpec
    from robotd.control.process import ControlLane
    from robotd.shm import FrameRing, ring_slots

    cfg = load_config(None, ['robot.start="idle"', "control.lock_memory=false"])
    prefix = f"robotd-bench-tick-{os.getpid()}-"
    rings = {
        n: FrameRing.create(prefix + n, (c.height, c.width, 3), ring_slots(c.fps, 1.0))
        for n, c in cfg.cameras.items()
    }
    ctx = zmq.Context.instance()
    up = ctx.socket(zmq.PULL)
    up.bind(f"ipc://{tmp}/up.sock")
    down = ctx.socket(zmq.PUSH)
    spec = ControlSpec(
        config=cfg.model_dump(mode="json"),
        run_id="bench",
        up=f"ipc://{tmp}/up.sock",
        down=f"ipc://{tmp}/down.sock",
        estop=f"ipc://{tmp}/lane.sock",
        shm_prefix=prefix,
        rings={n: r.name for n, r in rings.items()},
    )
    lane = ControlLane(spec)
    down.connect(spec.down)
    return lane, up, down, rings


def measure_ticks(n: int) -> dict[str, Any]:
    """Time n ticks of a real lane; a chunk of 16 rows answers every ask at once."""
    with tempfile.TemporaryDirectory(prefix="rbt-") as tmp:
        lane, up, down, rings = _lane(Path(tmp))
        k = lane.kernel
        k.set_contract(8)
        k.command("start")
        lane.ticker.start()  # only its origin (stats' elapsed time): the bench sets the pace
        gc.collect()
        gc.freeze()
        try:
            ticks, loops, stats, sent = _timed_loop(lane, up, down, rings, n)
        finally:
            gc.unfreeze()
            lane.close()
            up.close(linger=0)
            down.close(linger=0)
            for ring in rings.values():
                ring.close()
                ring.unlink()
    return {
        "tick_us": {"p50": _pct(ticks, 50), "p99": _pct(ticks, 99), "max": round(max(ticks), 1)},
        "loop_us": {"p50": _pct(loops, 50), "p99": _pct(loops, 99)},
        "stats_us": {"p50": _pct(stats, 50), "p99": _pct(stats, 99)},
        "stats_bytes": sent // max(1, len(stats)),
        "acts": k.counters.acts,
        "holds": k.counters.holds,
    }


def _timed_loop(
    lane: Any, up: Any, down: Any, rings: dict[str, Any], n: int
) -> tuple[list[float], list[float], list[float], int]:
    """n timed ticks after 200 warm-up ones: (tick µs, loop µs, stats µs, stats bytes)."""
    import numpy as np

    from robotd.lane import codec
    from robotd.lane.messages import Ask, ChunkRows, Rows

    k, io = lane.kernel, lane.io
    period = round(1e9 / lane.cfg.control.hz)
    now = time.monotonic_ns()
    ticks, loops, stats, sent = [], [], [], 0
    for i in range(n + 200):
        now += period
        for ring in rings.values():  # the camera processes' part, not timed
            ring.begin()
            ring.commit(now)
        t0 = time.perf_counter_ns()
        lane.drain()
        joints = io.driver.read()
        frames = io.frames()
        truth = io.driver.ground_truth()
        ta = time.perf_counter_ns()
        target = k.update(now, joints, frames, truth, 0)
        codec.encode_batch(lane.outbox)  # (the send below encodes it again)
        tb = time.perf_counter_ns()
        if target is not None:
            io.driver.write(target)
        asks = [m for m in lane.outbox if isinstance(m, Ask)]
        lane.flush()
        t1 = time.perf_counter_ns()
        if i % lane.stats_every == 0:
            data = codec.encode(lane.stats())
            stats.append((time.perf_counter_ns() - t1) / 1e3)
            sent += len(data)
        if i >= 200:
            ticks.append((tb - ta) / 1e3)
            loops.append((t1 - t0) / 1e3)
        for a in asks:  # the worker's answer, on the real inbound socket
            rows = np.tile(k.shield.last, (16, 1))
            down.send(codec.encode(ChunkRows(a.id, a.wep, a.s, Rows.of(rows))))
        while up.poll(0):
            up.recv()
    return ticks, loops, stats, sent


def measure_codecs(n: int = 50_000) -> dict[str, Any]:
    """The Step message: msgspec (the lane's codec) vs msgpack + dicts, encode and decode."""
    import msgpack

    from robotd.lane import codec
    from robotd.lane.messages import Step

    pos, vel = [0.1, 0.2, 0.3], [0.0, 0.1, 0.2]
    cams = {"top": (100, 123_456_789), "wrist": (100, 123_456_780)}
    gt = {"tracking_error": 0.01, "tip_x": 0.1, "tip_y": 0.2, "target_x": 0.1, "target_y": 0.2}

    def typed() -> bytes:
        return codec.encode(Step(1, "abc123-1", 1234, 123_456_789_012, pos, vel, cams, True, gt=gt))

    def dicts() -> bytes:
        rec = {
            "k": "step", "ep": 1, "wep": "abc123-1", "s": 1234, "t": 123_456_789_012,
            "pos": pos, "vel": vel, "cams": cams, "ok": True, "gt": gt,
        }  # fmt: skip
        return msgpack.packb(rec)

    def timed(fn: Any) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(n // 5):
                fn()
            best = min(best, (time.perf_counter_ns() - t0) / (n // 5) / 1e3)
        return round(best, 3)

    a, b = typed(), dicts()
    out = {
        "msgspec": {"encode_us": timed(typed), "decode_us": timed(lambda: codec.decode_up(a))},
        "msgpack_dict": {"encode_us": timed(dicts), "decode_us": timed(lambda: msgpack.unpackb(b))},
    }
    out["msgspec"]["bytes"], out["msgpack_dict"]["bytes"] = len(a), len(b)
    return out


def _control_pid(parent: int) -> int | None:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().split()
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[3]) == parent and b"robotd.control.process" in cmd:
            return int(proc.name)
    return None


def measure_memory(seconds: float) -> dict[str, float]:
    """VmRSS and VmLck of the control process of a real `robotd run` on config/sim.toml."""
    with tempfile.TemporaryDirectory(prefix="rbt-") as tmp:
        cmd = [sys.executable, "-m", "robotd", "run", "--no-status"]
        cmd += ["--set", f'runtime.dir="{tmp}/run"', "--duration", str(seconds + 30)]
        cmd += ["--set", "trace.enabled=false"]
        proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            pid = None
            while pid is None and time.monotonic() < deadline and proc.poll() is None:
                pid = _control_pid(proc.pid)
                time.sleep(0.1)  # polling /proc: there is no event for "a child appeared"
            if pid is None:
                raise BenchError("the daemon's control process never appeared")
            time.sleep(seconds)  # let it run at steady state before reading its memory
            fields = {}
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmLck", "Threads"):
                    fields[key] = int(value.split()[0])
        finally:
            proc.terminate()
            proc.wait(30)
    return {
        "control_rss_mb": round(fields["VmRSS"] / 1024, 1),
        "control_vmlck_mb": round(fields["VmLck"] / 1024, 1),
        "control_threads": fields["Threads"],
    }


def _median_of_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One figure per key: the median over the runs of each run's p50 / p99 / max."""
    import statistics

    out = dict(runs[-1])
    for key in ("tick_us", "loop_us", "stats_us"):
        out[key] = {q: round(statistics.median(r[key][q] for r in runs), 2) for q in runs[0][key]}
    out["runs"] = [{"p50": r["tick_us"]["p50"], "p99": r["tick_us"]["p99"]} for r in runs]
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    ticks = _median_of_runs([measure_ticks(args.ticks) for _ in range(args.repeat)])
    codecs = measure_codecs()
    memory = measure_memory(args.seconds)
    t, s, lp = ticks["tick_us"], ticks["stats_us"], ticks["loop_us"]
    print_table(
        ["what", "p50 µs", "p99 µs", "target"],
        [
            ["tick (update + its messages encoded)", t["p50"], t["p99"], "p99 <= 50"],
            [f"stats message ({ticks['stats_bytes']} B)", s["p50"], s["p99"], "cheap"],
            ["loop (drain, read, tick, write, send)", lp["p50"], lp["p99"], "-"],
        ],
        title=f"control lane work per tick, median of {args.repeat} runs of {args.ticks} "
        f"ticks, config/sim.toml ({ticks['acts']} acts a run, max {t['max']} µs)",
        digits=2,
    )
    per_run = ", ".join(f"{r['p50']}/{r['p99']}" for r in ticks["runs"])
    print(f"tick p50/p99 µs per run: {per_run}")
    m, d = codecs["msgspec"], codecs["msgpack_dict"]
    print_table(
        ["codec", "encode µs", "decode µs", "bytes"],
        [
            ["msgspec Structs (used)", m["encode_us"], m["decode_us"], m["bytes"]],
            ["msgpack + dicts (before)", d["encode_us"], d["decode_us"], d["bytes"]],
        ],
        title="the per-tick Step message",
        digits=3,
    )
    print(
        f"msgspec / msgpack+dicts: encode {ratio(m['encode_us'], d['encode_us'])}, "
        f"decode {ratio(m['decode_us'], d['decode_us'])} (decode validated by type)"
    )
    print(
        f"control process: RSS {memory['control_rss_mb']} MB (target <= 100), VmLck "
        f"{memory['control_vmlck_mb']} MB (target <= 120), {memory['control_threads']} threads"
    )
    if args.json:
        emit_json(
            {
                "tick_us": {"p50": t["p50"], "p99": t["p99"]},
                "tick_runs": ticks["runs"],
                "stats_us": s,
                "loop_us": lp,
                "control_rss_mb": memory["control_rss_mb"],
                "control_vmlck_mb": memory["control_vmlck_mb"],
                "codecs": codecs,
            }
        )
    return 0


if __name__ == "__main__":
    run_main(main)
