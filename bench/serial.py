"""Servo bus round trip: one tick's sync read + sync write, and what it costs the CPU.

    python bench/serial.py --emulate dynamixel|feetech [--servos 6] [--baud 1000000]
    python bench/serial.py --port /dev/ttyUSB0 --protocol feetech --calibration FILE
    [--seconds 5] [--json]

Back to back, as a control tick does: the driver's read() (one sync read of the state
block, FAST_SYNC_READ where the servos have it) then write() (one sync write of the goals,
here the positions just read, so nothing moves). Beside it:

  floor     the wire time of the bytes of one cycle at the baud rate (request, replies,
            goals; 10 bits a byte), the least any implementation can take
  raw pty   the same bytes exchanged without the driver (write the request, wait for the
            replies' byte count, write the goals): the emulator's and the pty's own cost,
            measured in this run

rtt is read() + write(); rate the cycles a second achieved; cpu_pct the process's CPU time
over the wall time of the loop (a driver that polls would be near 100). With --emulate the
emulator runs as its own process and times its replies by the baud rate. With --port the
servos are real (hardware in the loop); torque stays off. The JSON last line:
{"protocol", "servos", "baud", "rtt_p50_ms", "rtt_p99_ms", "floor_ms", "rate_hz",
"cpu_pct", "raw_p50_ms", "ratio_vs_raw", "target_ms", "fast_sync_read", "failed_reads"};
target_ms is 1.5 × floor + 1.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# `python bench/serial.py` puts bench/ first on sys.path, where this file would shadow
# pyserial's `serial`: the repo root takes its place.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import numpy as np

from bench._common import BenchError, emit_json, median, print_table, ratio, run_main
from drivers.base import DriverContext, DriverFault, JointDriver, build_joints
from drivers.emulators.launch import start_emulator
from drivers.servo.calibration import Calibration, JointCalibration, save_calibration
from drivers.servo.joints import ServoJoints


def _calibration(path: Path, protocol: str, n: int) -> Path:
    joints = {
        f"j{i}": JointCalibration(id=i, homing_offset=0, range_min=0, range_max=4095)
        for i in range(1, n + 1)
    }
    save_calibration(Calibration(protocol=protocol, joints=joints), path)
    return path


def _driver(protocol: str, port: str, n: int, baud: int, calibration: Path) -> ServoJoints:
    options = {"port": port, "ids": list(range(1, n + 1)), "baud": baud}
    options["calibration"] = str(calibration)
    warnings: list[str] = []
    d = build_joints(
        protocol, [f"j{i}" for i in range(1, n + 1)], options, DriverContext(warn=warnings.append)
    )
    try:
        d.open()
    except DriverFault as exc:
        raise BenchError(f"cannot open the {protocol} bus on {port}: {exc}") from None
    for w in warnings:
        print(f"driver: {w}", file=sys.stderr)
    assert isinstance(d, ServoJoints)
    return d


def _cycle_bytes(d: ServoJoints) -> tuple[bytes, int, bytes]:
    """One cycle's request, reply byte count and goal packet, as the driver sends them."""
    bus, codec = d.bus, d.bus.codec
    fast = d.use_fast_read()
    address, length = d.state_block
    request = codec.sync_read(address, length, d.ids, fast)
    replies = codec.reply_bytes(length, len(d.ids), fast)
    goal_address, size = d.goal_register
    goals = codec.sync_write(goal_address, size, [(i, d.encode_goal(2048)) for i in d.ids])
    assert bus is not None
    return request, replies, goals


def _loop(d: JointDriver, seconds: float, warmup: int) -> tuple[list[float], int, float, float]:
    """(round trips, failed reads, cpu s, wall s). A failed read (DriverFault after its
    retries: on a loaded machine the emulator can be descheduled past the tick's budget)
    is counted, as the control lane would, and the loop goes on."""
    rtts, failed = [], 0
    position = d.read().position
    for _ in range(warmup):
        position = d.read().position
        d.write(position)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    end = wall0 + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        try:
            position = d.read().position
        except DriverFault:
            failed += 1
            continue
        d.write(position)
        rtts.append(time.perf_counter() - t0)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if not rtts:
        raise BenchError(f"every read failed ({failed})")
    return rtts, failed, cpu, wall


def _raw_loop(port: str, request: bytes, replies: int, goals: bytes, seconds: float) -> list[float]:
    """The same bytes over the pty with nothing but os.read/os.write and select."""
    import serial

    ser = serial.Serial(port, 1_000_000, timeout=0)
    fd = ser.fileno()
    rtts = []
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            os.write(fd, request)
            got = 0
            while got < replies:
                if not select.select((fd,), (), (), 0.1)[0]:
                    raise BenchError("raw exchange: the bus stopped answering")
                got += len(os.read(fd, 4096))
            os.write(fd, goals)
            rtts.append(time.perf_counter() - t0)
    finally:
        ser.close()
    return rtts


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--emulate", choices=("dynamixel", "feetech"))
    src.add_argument("--port", help="a real bus (hardware in the loop)")
    p.add_argument("--protocol", choices=("dynamixel", "feetech"), help="with --port")
    p.add_argument("--calibration", type=Path, help="with --port: the arm's calibration file")
    p.add_argument("--servos", type=int, default=6)
    p.add_argument("--baud", type=int, default=1_000_000)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.servos < 1 or a.servos > 32 or a.seconds <= 0 or a.baud <= 0:
        raise BenchError("--servos must be 1..32, --seconds and --baud > 0")
    if a.port and not (a.protocol and a.calibration):
        raise BenchError("--port needs --protocol and --calibration (the arm's own)")
    return a


def _measure(a: argparse.Namespace, protocol: str) -> dict[str, Any]:
    """The driver's cycles (and, on an emulator, the raw pty exchange) -> the result."""
    emulator = start_emulator(protocol, range(1, a.servos + 1), baud=a.baud) if a.emulate else None
    try:
        with tempfile.TemporaryDirectory(prefix="robotd-bench-serial-") as tmp:
            port = emulator.port if emulator else a.port
            cal = a.calibration or _calibration(Path(tmp) / "cal.json", protocol, a.servos)
            d = _driver(protocol, port, a.servos, a.baud, cal)
            try:
                request, replies, goals = _cycle_bytes(d)
                rtts, failed, cpu, wall = _loop(d, a.seconds, warmup=50)
                fast = d.use_fast_read()
            finally:
                d.close()
            raw = _raw_loop(port, request, replies, goals, a.seconds / 2) if emulator else []
    finally:
        if emulator:
            emulator.stop()
    floor_ms = (len(request) + replies + len(goals)) * 10 / a.baud * 1e3
    return {
        "protocol": protocol,
        "servos": a.servos,
        "baud": a.baud,
        "cycles": len(rtts),
        "rtt_p50_ms": round(_pct(rtts, 50), 3),
        "rtt_p99_ms": round(_pct(rtts, 99), 3),
        "floor_ms": round(floor_ms, 3),
        "rate_hz": round(len(rtts) / wall, 1),
        "cpu_pct": round(100 * cpu / wall, 1),
        "raw_p50_ms": round(_pct(raw, 50), 3) if raw else None,
        "raw_p99_ms": round(_pct(raw, 99), 3) if raw else None,
        "raw_rate_hz": round(len(raw) / (a.seconds / 2), 1) if raw else None,
        "ratio_vs_raw": ratio(median(rtts), median(raw)) if raw else None,
        "target_ms": round(1.5 * floor_ms + 1, 3),
        "fast_sync_read": fast,
        "failed_reads": failed,
    }


def main() -> int:
    a = _parse()
    protocol = a.emulate or a.protocol
    r = _measure(a, protocol)
    rows = [
        ["driver read+write", r["rtt_p50_ms"], r["rtt_p99_ms"], r["rate_hz"], r["cpu_pct"]],
        ["raw pty exchange", r["raw_p50_ms"], r["raw_p99_ms"], r["raw_rate_hz"], None],
        ["wire floor", r["floor_ms"], None, 1e3 / r["floor_ms"], None],
    ]
    title = (
        f"{protocol}, {a.servos} servos, {a.baud} baud, {r['cycles']} cycles"
        f"{' (FAST_SYNC_READ)' if r['fast_sync_read'] else ''}, {r['failed_reads']} failed "
        f"reads; target p50 <= {r['target_ms']} ms"
    )
    print_table(["", "p50 ms", "p99 ms", "rate Hz", "cpu %"], rows, title=title, digits=3)
    if a.json:
        emit_json(r)
    return 0

if __name__ == "__main__":
    run_main(main)
