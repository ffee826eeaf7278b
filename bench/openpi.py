"""The act round trip on loopback: robotd's native link, robotd's openpi adapter, and
openpi-client's own client, on the same DROID-like observation and a policy that does no
work.

    python bench/openpi.py [--calls 1000] [--runs 5] [--json]

The observation: two 224x224x3 uint8 images, 8 float32 joints (7 + gripper), a prompt.
The answer: 10 x 8 float32 zeros.

  native          robotd.link.client.PolicyClient.act (inline window) against
                  `robotd serve bench.openpi:NoWorkPolicy --inline --bind
                  stream+tcp://...`: the policy called in the worker's poll loop, as
                  openpi's server runs it (the same server-side work), on robotd's byte
                  stream transport (robotd.stream)
  native_zmq      the same over ZeroMQ (`--bind tcp://...`): what the transport costs
  native_isolated as native, against `--copies 1`: the policy in a copy process of its
                  own (robotd's default: a crash, an OOM, a hang told apart), one hop more
  openpi_adapter  robotd.link.openpi.client.OpenpiLink.act against openpi-server's
                  WebsocketPolicyServer (the real package from PyPI, its own venv)
  openpi_client   openpi-client's WebsocketClientPolicy.infer against the same server
                  (run in that venv: openpi-client pins numpy < 2)
  zmq_floor       no robotd code: the two images as frames of a raw pyzmq DEALER request,
                  answered by a raw ROUTER with 320 bytes (the transport's own cost, the
                  floor under any ZeroMQ link)

Each run times `--calls` calls after 20 warm-up calls; runs of the clients interleave,
and each figure is the median over `--runs` runs of that run's p50 / p99. With --json the
last line is {"native": {"p50_ms", "p99_ms"}, "native_zmq": {...}, "native_isolated": {...},
"openpi_adapter": {...}, "openpi_client": {...}, "zmq_floor": {...},
"adapter_vs_client_p50", "native_vs_client_p50", "native_zmq_vs_client_p50",
"floor_vs_client_p50"} (ratios of the p50s), and "native_vs_client_p50_per_run" (each
run's own ratio). Target (issue 10):
native p50 <= 0.5 x openpi_client's, adapter <= 1.1 x.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/openpi.py`
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "openpi"))

import anyio
import numpy as np

from bench._common import (
    BenchError,
    child_env,
    emit_json,
    median,
    print_table,
    ratio,
    run_main,
    start_serve,
    tail,
)

WARMUP = 20
ZEROS = np.zeros((10, 8), dtype=np.float32)


class NoWorkPolicy:
    """The native worker's policy: does no work, answers 10 x 8 float32 zeros."""

    def infer(self, inputs: Any, *, episode: Any = None) -> np.ndarray:
        return ZEROS


def droid_observation() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": np.zeros(7, dtype=np.float32),
        "observation/gripper_position": np.zeros(1, dtype=np.float32),
        "prompt": "pick up the cup",
    }


def native_observation() -> dict[str, Any]:
    obs = droid_observation()
    return {
        "exterior": obs["observation/exterior_image_1_left"],
        "wrist": obs["observation/wrist_image_left"],
        "joints.pos": np.zeros(8, dtype=np.float32),
        "prompt": obs["prompt"],
    }


def percentiles(rtt: list[float]) -> dict[str, float]:
    arr = np.asarray(rtt)
    return {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}


async def _native(endpoint: str, calls: int) -> list[float]:
    from robotd.link.client import PolicyClient

    client = PolicyClient(endpoint, timeout_s=10)
    await client.connect()
    obs = native_observation()
    out = []
    try:
        for i in range(WARMUP + calls):
            t = time.perf_counter()
            await client.act("bench", i, [i], [obs])
            if i >= WARMUP:
                out.append((time.perf_counter() - t) * 1e3)
    finally:
        await client.close()
    return out


async def _adapter(url: str, calls: int) -> list[float]:
    from robotd.link.openpi.client import OpenpiLink

    link = OpenpiLink(url)
    await link.connect(deadline_s=30)
    obs = droid_observation()
    out = []
    try:
        for i in range(WARMUP + calls):
            t = time.perf_counter()
            await link.act(obs, timeout_s=10)
            if i >= WARMUP:
                out.append((time.perf_counter() - t) * 1e3)
    finally:
        await link.close()
    return out


def _openpi_client(python: Path, url: str, calls: int) -> list[float]:
    from peer_venv import HERE

    cmd = [str(python), str(HERE / "openpi_peer_client.py"), url, "--calls", str(calls)]
    cmd += ["--warmup", str(WARMUP)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise BenchError(f"openpi-client run failed:\n{tail(proc.stderr)}")
    return json.loads(proc.stdout.splitlines()[-1])["rtt_ms"]


def _start_native(
    copies: int, inline: bool = False, bind: str = "stream+tcp://127.0.0.1:0"
) -> tuple[subprocess.Popen[str], str]:
    proc, found = start_serve(
        "bench.openpi:NoWorkPolicy",
        *("--bind", bind, "--copies", str(copies)),
        *(["--inline"] if inline else []),
        listening=r"listening on (\S+)",
        what="robotd serve",
    )
    return proc, found.group(1)


_FLOOR_SERVER = """
import sys, zmq
s = zmq.Context().socket(zmq.ROUTER)
s.bind("tcp://127.0.0.1:0")
print(s.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
reply = bytes(320)
while True:
    frames = s.recv_multipart(copy=False)
    s.send_multipart([frames[0], b"h", reply])
"""


def _start_floor() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _FLOOR_SERVER], env=child_env(), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _floor(endpoint: str, calls: int) -> list[float]:
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    obs = droid_observation()
    images = [obs["observation/exterior_image_1_left"], obs["observation/wrist_image_left"]]
    out = []
    try:
        for i in range(WARMUP + calls):
            t = time.perf_counter()
            sock.send_multipart([b"h", *images], copy=False)
            sock.recv_multipart()
            if i >= WARMUP:
                out.append((time.perf_counter() - t) * 1e3)
    finally:
        sock.close(linger=0)
    return out


def _start_openpi(log_dir: Path) -> tuple[Path, Any]:
    from peer_server import PeerServer
    from peer_venv import PeerUnavailable, peer_python

    try:
        python = peer_python()
    except PeerUnavailable as exc:
        raise BenchError(f"the openpi packages cannot be installed here: {exc}") from None
    try:
        server = PeerServer(python, log_dir, policy="nowork").start()
    except RuntimeError as exc:
        raise BenchError(f"openpi server did not start: {exc}") from None
    return python, server


def measure(calls: int, runs: int, log_dir: Path) -> dict[str, list[dict[str, float]]]:
    python, server = _start_openpi(log_dir)
    # native: the policy in the worker's own process, as openpi's server runs it (the same
    # server-side work); native_isolated: in a copy process of its own (robotd's default,
    # which tells a crash, an OOM and a hang apart), one process hop more.
    native, endpoint = _start_native(0, inline=True)
    over_zmq, zmq_ep = _start_native(0, inline=True, bind="tcp://127.0.0.1:0")
    isolated, isolated_ep = _start_native(1)
    floor, floor_ep = _start_floor()
    results: dict[str, list[dict[str, float]]] = {
        "native": [],
        "native_zmq": [],
        "native_isolated": [],
        "openpi_adapter": [],
        "openpi_client": [],
        "zmq_floor": [],
    }
    uvloop = {"use_uvloop": True}
    try:
        for _ in range(runs):
            results["native"].append(
                percentiles(anyio.run(_native, endpoint, calls, backend_options=uvloop))
            )
            results["native_zmq"].append(
                percentiles(anyio.run(_native, zmq_ep, calls, backend_options=uvloop))
            )
            results["native_isolated"].append(
                percentiles(anyio.run(_native, isolated_ep, calls, backend_options=uvloop))
            )
            results["openpi_adapter"].append(
                percentiles(anyio.run(_adapter, server.url, calls, backend_options=uvloop))
            )
            results["openpi_client"].append(percentiles(_openpi_client(python, server.url, calls)))
            results["zmq_floor"].append(percentiles(_floor(floor_ep, calls)))
    finally:
        server.kill()
        for proc in (native, over_zmq, isolated, floor):
            proc.terminate()
            proc.wait(10)
    return results


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", type=int, default=1000, help="timed calls per run (default 1000)")
    p.add_argument("--runs", type=int, default=5, help="runs per client (default 5)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = p.parse_args(argv)
    if args.calls < 10 or args.runs < 1:
        p.error("--calls must be >= 10 and --runs >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    with tempfile.TemporaryDirectory(prefix="bench-openpi-") as tmp:
        results = measure(args.calls, args.runs, Path(tmp))
    summary = {
        name: {k: round(median(r[k] for r in runs), 3) for k in ("p50_ms", "p99_ms")}
        for name, runs in results.items()
    }
    base = summary["openpi_client"]["p50_ms"]
    rows = [
        [
            name,
            s["p50_ms"],
            s["p99_ms"],
            " ".join(f"{r['p50_ms']:.3f}" for r in results[name]),
            ratio(s["p50_ms"], base),
        ]
        for name, s in summary.items()
    ]
    print_table(
        ["client", "p50 ms", "p99 ms", "p50 per run", "p50 / openpi_client"],
        rows,
        title=f"act round trip, DROID-like observation, {args.calls} calls x {args.runs} runs",
        digits=3,
    )
    per_run = [
        ratio(n["p50_ms"], c["p50_ms"])
        for n, c in zip(results["native"], results["openpi_client"], strict=True)
    ]
    print(f"native / openpi_client p50, run by run (each pair measured back to back): {per_run}")
    native = ratio(summary["native"]["p50_ms"], base)
    adapter = ratio(summary["openpi_adapter"]["p50_ms"], base)
    floor = ratio(summary["zmq_floor"]["p50_ms"], base)
    over_zmq = ratio(summary["native_zmq"]["p50_ms"], base)
    def verdict(value: float | None, target: float) -> str:
        return "met" if value is not None and value <= target else "NOT met"

    print(f"native / openpi_client p50: {native} (target <= 0.5: {verdict(native, 0.5)}; "
          f"over ZeroMQ {over_zmq}, whose raw floor alone is {floor}); "
          f"adapter / openpi_client: {adapter} "
          f"(target <= 1.1: {verdict(adapter, 1.1)})")  # fmt: skip
    if args.json:
        emit_json(
            {
                **summary,
                "adapter_vs_client_p50": adapter,
                "native_vs_client_p50": native,
                "native_zmq_vs_client_p50": over_zmq,
                "native_vs_client_p50_per_run": per_run,
                "floor_vs_client_p50": floor,
            }
        )
    return 0


if __name__ == "__main__":
    run_main(main)
