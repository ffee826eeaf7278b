"""Upload-ahead vs inline windows: what an act costs on a slow link.

    python bench/uplink.py [--seconds 20] [--delay-ms 20] [--mbit 50] [--json]

Two 224x224 cameras (jpeg) read at at=[-15, 0] plus a state stream (joints.pos), 15 Hz,
an act every 8 steps, against a real worker process (`robotd serve`) reached over loopback
through a small proxy in this script that delays each direction (default 20 ms) and limits
its bandwidth (default 50 Mbit/s, shared by the act and observe connections). The robot
side is synthetic (frames written into shared-memory rings, step records made here), the
rest is robotd's: WindowPlanner, ActLink, Uplink, PolicyClient, the worker and its store.

  stream     robotd's upload-ahead: windows go up as the steps are made, the act names them
  inline     the same window, encoded the same way, sent inside every act
  no_window  an act that carries no observation at all (the floor)

Per mode: the act request's size, the uploaded bytes per act, and the act round trip (ask
to chunk) p50/p99. With --json the last line is {"stream": {"act_bytes",
"upload_bytes_per_act", "rtt_p50_ms", "rtt_p99_ms"}, "inline": {...}, "no_window": {...},
"rtt_ratio_vs_no_window"} (stream p50 / no_window p50).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/uplink.py`

import anyio
import cv2
import numpy as np

from bench._common import BenchError, emit_json, print_table, ratio, run_main, start_serve
from bench._proxy import Proxy
from robotd.contract import Actions, Camera, Observations, Stream
from robotd.lane.messages import ActFailed, Ask, Merged, Step
from robotd.link.act import ActLink
from robotd.link.chunks import ChunkLimits
from robotd.link.client import PolicyClient
from robotd.link.steps import LinkCounters, RingFrames, StepReader, StepRing
from robotd.link.uplink import Uplink
from robotd.link.windows import WindowPlanner
from robotd.shm import FrameRing

HZ, EVERY, SIDE, LOOKBACK = 15.0, 8, 224, 15
CAMERAS = ("top", "wrist")
KEYS = [*CAMERAS, "joints.pos", "joints.vel"]
WARMUP_ACTS = 2


class BenchPolicy:
    """The worker's policy: reads two cameras at [-15, 0] and the joints; answers at once."""

    observations = Observations(
        streams={
            **{
                c: Stream(at=[-LOOKBACK, 0], camera=Camera(width=SIDE, height=SIDE, codec="jpeg"))
                for c in CAMERAS
            },
            "joints.pos": Stream(),
        }
    )
    actions = Actions(open_loop_horizon=EVERY)

    def infer(self, inputs: Any) -> np.ndarray:
        return np.zeros((EVERY, 3))


# ---- the link: a delay and bandwidth proxy ---------------------------------------------------


# ---- the robot side --------------------------------------------------------------------------


class Robot:
    """Two camera rings in shared memory and the step records the control lane would make."""

    def __init__(self) -> None:
        self.rings = {
            c: FrameRing.create(f"robotd-bench-{os.getpid()}-{c}", (SIDE, SIDE, 3), 64)
            for c in CAMERAS
        }
        self.steps = StepRing(keep=LOOKBACK + 64)
        y, x = np.mgrid[0:SIDE, 0:SIDE]
        self._base = np.stack([x, y, (x + y) // 2], -1).astype(np.int16)
        self._rng = np.random.default_rng(0)

    def _frame(self, s: int, phase: int) -> np.ndarray:
        img = self._base + self._rng.normal(0, 4, self._base.shape).astype(np.int16)
        img = np.clip(img, 0, 255).astype(np.uint8)
        cx = int(SIDE / 2 + 70 * np.cos(0.2 * s + phase))
        cy = int(SIDE / 2 + 70 * np.sin(0.3 * s + phase))
        cv2.circle(img, (cx, cy), 18, (220, 30, 30), -1)
        return img

    def step(self, wep: str, s: int) -> Step:
        now = time.monotonic_ns()
        cams: dict[str, tuple[int, int] | None] = {
            c: (ring.write(self._frame(s, i), now), now)
            for i, (c, ring) in enumerate(self.rings.items())
        }
        rec = Step(1, wep, s, now, [0.1 * s, 0.2, 0.3], [0.0, 0.0, 0.0], cams, True)
        self.steps.add(rec)
        return rec

    def reader(self) -> StepReader:
        return StepReader(self.steps, RingFrames(self.rings))

    def close(self) -> None:
        for ring in self.rings.values():
            ring.close()
            ring.unlink()


# ---- one mode --------------------------------------------------------------------------------


class Run:
    """Steps at 15 Hz; an act every 8 steps (never two in flight); each act's round trip."""

    def __init__(
        self, mode: str, robot: Robot, client: PolicyClient, uplink: Uplink, link: ActLink
    ) -> None:
        self.mode, self.robot, self.client, self.uplink, self.link = (
            mode,
            robot,
            client,
            uplink,
            link,
        )
        self.wep = f"bench-{mode}"
        self.rtts: list[float] = []
        self.act_bytes: list[int] = []
        self.reads: set[tuple[int, str]] = set()
        self.arrived: tuple[int, float] | None = None  # (ask step, time) of the last chunk
        self.in_flight: int | None = None
        self.last_ask: int | None = None  # the act before the one in flight

    async def _act(self, step: int, started: float) -> None:
        sent = self.client.bytes_sent
        ask = Ask(step, self.wep, step, 1, 0)
        if self.mode == "stream":
            act = self.link.begin(ask)
            assert act is not None
            self.reads |= {(s, k) for s, keys in act.window.needed().items() for k in keys}
            await self.link.finish(act)
        elif self.mode == "inline":
            window = self.link.planner.plan(step, self.last_ask)
            pairs = [(s, k) for s, keys in window.needed().items() for k in sorted(keys)]
            inline = await self.uplink.inline(self.wep, pairs)
            reads = [list(window.keys_at[s]) for s in window.steps]
            await self.client.act_steps(
                self.wep, step, list(window.steps), reads, inline=inline, wait_s=0.0
            )
        else:
            await self.client.act_steps(self.wep, step, [step], [[]], wait_s=0.0)
        self.last_ask = step
        self.rtts.append((time.perf_counter() - started) * 1e3)
        self.act_bytes.append(self.client.bytes_sent - sent)
        self.arrived = (step, time.perf_counter())

    def send_down(self, msg: Any) -> None:
        if isinstance(msg, ActFailed):
            raise BenchError(f"act failed: {msg.reason}")

    async def drive(self, seconds: float) -> None:
        n = int(seconds * HZ)
        t0 = time.perf_counter()
        next_ask = 0
        async with anyio.create_task_group() as tg:
            for s in range(n):
                await anyio.sleep(max(0.0, t0 + s / HZ - time.perf_counter()))
                rec = self.robot.step(self.wep, s)
                if self.mode == "stream":
                    self.uplink.on_step(rec)
                if self.arrived is not None:  # the chunk merges at the first step after it
                    asked, _ = self.arrived
                    self.arrived, self.in_flight = None, None
                    if self.mode == "stream":
                        self.uplink.on_chunk(Merged(0, self.wep, asked, s, EVERY, s - asked, False))
                if self.in_flight is None and s >= next_ask:
                    self.in_flight, next_ask = s, s + EVERY
                    tg.start_soon(self._act, s, time.perf_counter())
            with anyio.fail_after(30):
                while self.in_flight is not None and self.arrived is None:
                    await anyio.sleep(0.01)


def _summary(run: Run, upload_bytes: int) -> dict[str, float]:
    rtts, sizes = run.rtts[WARMUP_ACTS:], run.act_bytes[WARMUP_ACTS:]
    if not rtts:
        raise BenchError(f"{run.mode}: no acts measured (run longer: --seconds)")
    return {
        "act_bytes": round(float(np.mean(sizes)), 1),
        "upload_bytes_per_act": round(upload_bytes / len(run.rtts), 1),
        "rtt_p50_ms": round(float(np.percentile(rtts, 50)), 2),
        "rtt_p99_ms": round(float(np.percentile(rtts, 99)), 2),
    }


async def _measure(
    endpoints: list[str], robot: Robot, seconds: float
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    client = PolicyClient(endpoints[0], timeout_s=30)
    hello = await client.connect(observe=True)
    assert hello.observations is not None
    planner = WindowPlanner(hello.observations.resolve(HZ), KEYS)
    cams = {c: s.camera for c, s in hello.observations.streams.items() if c in CAMERAS}
    out: dict[str, dict[str, float]] = {}
    extra: dict[str, float] = {}
    for mode in ("stream", "inline", "no_window"):
        counters = LinkCounters()
        uplink = Uplink(
            endpoints[1],
            planner,
            robot.reader(),
            cams,
            counters,
            timing="realtime",
        )
        uplink.conn.sent_log = []
        link = ActLink(
            client,
            planner,
            robot.reader(),
            lambda m: None,
            control_hz=HZ,
            actions=hello.actions,
            limits=ChunkLimits(),
            uplink=uplink,
            counters=counters,
        )
        run = Run(mode, robot, client, uplink, link)
        link.send_down = run.send_down
        async with anyio.create_task_group() as tg:
            if mode == "stream":
                tg.start_soon(uplink.run)
            await run.drive(seconds)
            tg.cancel_scope.cancel()
        out[mode] = _summary(run, counters.uploaded_bytes)
        if mode == "stream":
            # The run stops before the next act is asked; what went up for it counts as read.
            upcoming = uplink.predicted(run.wep)
            if upcoming is not None and run.in_flight is None:
                needed = planner.needed(upcoming, run.last_ask).items()
                run.reads |= {(s, k) for s, keys in needed for k in keys}
            unread = sum(
                n
                for _, s, keys, n in uplink.conn.sent_log
                if not all((s, k) in run.reads for k in keys)
            )
            extra = {
                "acts": len(run.rtts),
                "unread_upload_bytes": unread,
                "late_uploads": uplink.mispredicted,
                "inline_frames": counters.inline_frames,
                "skipped_frames": counters.skipped_frames,
            }
    await client.close()
    return out, extra


def _start_worker() -> tuple[subprocess.Popen[str], list[str]]:
    proc, found = start_serve(
        "bench.uplink:BenchPolicy",
        "--bind",
        "tcp://127.0.0.1:0",
        listening=r"listening on (\S+) \(observe (\S+)\)",
        what="the worker",
    )
    return proc, [found.group(1), found.group(2)]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="per mode (default 20)")
    p.add_argument("--delay-ms", type=float, default=20.0, help="each way (default 20)")
    p.add_argument("--mbit", type=float, default=50.0, help="link bandwidth (default 50)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = p.parse_args(argv)
    if not (args.seconds > 0 and args.delay_ms >= 0 and args.mbit > 0):
        p.error("--seconds and --mbit must be > 0, --delay-ms >= 0")
    return args


def _with_proxy(args: argparse.Namespace, body: Callable[[list[str]], Awaitable[Any]]) -> Any:
    proc, endpoints = _start_worker()
    targets = [("127.0.0.1", int(ep.rsplit(":", 1)[1])) for ep in endpoints]
    proxy = Proxy(targets, args.delay_ms / 1e3, args.mbit)
    try:
        proxied = [f"tcp://127.0.0.1:{port}" for port in proxy.ports]
        return anyio.run(body, proxied, backend_options={"use_uvloop": True})
    finally:
        proxy.close()
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    robot = Robot()
    try:
        out, extra = _with_proxy(args, lambda eps: _measure(eps, robot, args.seconds))
    finally:
        robot.close()
    print_table(
        ["mode", "act bytes", "upload B/act", "rtt p50 ms", "rtt p99 ms"],
        [
            [m, v["act_bytes"], v["upload_bytes_per_act"], v["rtt_p50_ms"], v["rtt_p99_ms"]]
            for m, v in out.items()
        ],
        title=f"two {SIDE}x{SIDE} jpeg cameras at [-{LOOKBACK}, 0] + joints, {HZ:g} Hz, an act "
        f"every {EVERY} steps, {args.delay_ms:g} ms each way, {args.mbit:g} Mbit/s",
    )
    rtt_ratio = ratio(out["stream"]["rtt_p50_ms"], out["no_window"]["rtt_p50_ms"])
    window = out["inline"]["act_bytes"] - out["no_window"]["act_bytes"]
    print(
        f"stream: {extra['acts']} acts, {extra['unread_upload_bytes']} uploaded bytes read by "
        f"no act, {extra['late_uploads']} late uploads, {extra['inline_frames']} frames "
        f"inline, {extra['skipped_frames']} skipped\n"
        f"window per act (inline act - no-window act): {window:.0f} B; uploaded per act: "
        f"{out['stream']['upload_bytes_per_act']:.0f} B; rtt p50 vs no window: {rtt_ratio}"
    )
    if args.json:
        emit_json({**out, "rtt_ratio_vs_no_window": rtt_ratio})
    return 0


if __name__ == "__main__":
    run_main(main)
