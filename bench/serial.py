"""Servo bus round trip: one tick's sync read + sync write, and what it costs the CPU.

    python bench/serial.py --emulate dynamixel|feetech [--servos 6] [--baud 1000000]
    python bench/serial.py --config config/so101.toml --emulate
    python bench/serial.py --config my_arm.toml [--port /dev/serial/by-id/...]
    [--seconds 5] [--json]

Three sources of servos:
  --emulate PROTOCOL    a synthetic arm (joints j1..jN, IDs 1..N, full range) on the bus
                        emulator
  --config F --emulate  the config's own arm on the bus emulator, exactly as `robotd run
                        --config F --emulate` starts it (its joints, IDs, baud, options;
                        a calibration of the emulated arm); PROTOCOL may be given, and
                        must then be the config's joints.driver
  --config F            hardware in the loop: the config's joints, IDs, protocol (its
                        joints.driver), options and calibration file (joints.options.
                        calibration, beside the config), on the config's port or --port

Back to back, as a control tick does: the driver's read() (one sync read of the state
block, FAST_SYNC_READ where the servos have it) then write() (one sync write of the goals,
here the positions just read, so nothing moves). Beside it:

  floor     the wire time of the bytes of one cycle at the baud rate (request, replies,
            goals; 10 bits a byte), the least any implementation can take
  raw pty   the same bytes exchanged without the driver (write the request, wait for the
            replies' byte count, write the goals): the emulator's and the pty's own cost,
            measured in this run (on an emulator only)

rtt is read() + write(); rate the cycles a second achieved; cpu_pct the process's CPU time
over the wall time of the loop (a driver that polls would be near 100). On an emulator it
runs as its own process and times its replies by the baud rate. On real servos torque
stays off. The JSON last line:
{"protocol", "servos", "baud", "rtt_p50_ms", "rtt_p99_ms", "floor_ms", "rate_hz",
"cpu_pct", "raw_p50_ms", "ratio_vs_raw", "target_ms", "fast_sync_read", "failed_reads"};
target_ms is 1.5 × floor + 1.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
from robotd.config import Config, load_config
from robotd.errors import ConfigError

PROTOCOLS = ("dynamixel", "feetech")


@dataclass
class Arm:
    """The servos a run measures: the driver's name, joints, options and where relative
    paths (the calibration) resolve; `emulated` when the bus is one of our emulators (the
    raw pty exchange is then measured too)."""

    protocol: str
    names: list[str]
    options: dict[str, Any]
    config_dir: Path | None = None
    emulated: bool = False
    label: str = ""

    @property
    def port(self) -> str:
        return str(self.options["port"])

    @property
    def baud(self) -> int:
        return int(self.options.get("baud", 1_000_000))


def _synthetic(protocol: str, n: int, baud: int, tmp: Path) -> tuple[Arm, Callable[[], None]]:
    """--emulate PROTOCOL: joints j1..jN on IDs 1..N, full range, on a fresh emulator."""
    joints = {
        f"j{i}": JointCalibration(id=i, homing_offset=0, range_min=0, range_max=4095)
        for i in range(1, n + 1)
    }
    cal = tmp / "cal.json"
    save_calibration(Calibration(protocol=protocol, joints=joints), cal)
    try:
        emulator = start_emulator(protocol, range(1, n + 1), baud=baud)
    except RuntimeError as exc:
        raise BenchError(str(exc)) from None
    options = {"port": emulator.port, "ids": list(range(1, n + 1)), "baud": baud}
    options["calibration"] = str(cal)
    arm = Arm(protocol, list(joints), options, emulated=True, label="synthetic arm")
    return arm, emulator.stop


def _load(path: Path, overrides: list[str]) -> Config:
    try:
        cfg = load_config(path, overrides)
    except ConfigError as exc:
        raise BenchError(str(exc)) from None
    if cfg.joints.driver not in PROTOCOLS:
        raise BenchError(
            f"{path}: joints.driver is {cfg.joints.driver!r}; this bench measures a servo bus "
            f"({', '.join(PROTOCOLS)})"
        )
    return cfg


def _from_config(a: argparse.Namespace) -> tuple[Arm, Callable[[], None]]:
    """--config F [--port P | --emulate]: the config's own arm, on its bus or an emulator
    started as `robotd run --emulate` starts it (robotd.runtime.emulate)."""
    from robotd.runtime.emulate import start_emulation

    cfg = _load(a.config, [f"joints.options.port={json.dumps(a.port)}"] if a.port else [])
    if a.emulate not in (None, "config", cfg.joints.driver):
        raise BenchError(
            f"--emulate {a.emulate}: {a.config} drives {cfg.joints.driver!r} servos "
            "(give --emulate alone to emulate the config's arm)"
        )
    stop: Callable[[], None] = lambda: None  # noqa: E731 (nothing to stop on real servos)
    if a.emulate:
        try:
            extra, stop = start_emulation(cfg)
        except (ConfigError, RuntimeError) as exc:
            raise BenchError(str(exc)) from None
        try:
            cfg = _load(a.config, extra)
        except BaseException:
            stop()
            raise
    options = dict(cfg.joints.options)
    label = f"{a.config}{' on the emulator' if a.emulate else ''}"
    arm = Arm(
        cfg.joints.driver, list(cfg.joints.names), options,
        config_dir=a.config.resolve().parent, emulated=bool(a.emulate), label=label,
    )  # fmt: skip
    return arm, stop


@contextmanager
def _arm(a: argparse.Namespace) -> Iterator[Arm]:
    """The arm this run measures, its emulator (if any) stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="robotd-bench-serial-") as tmp:
        if a.config is not None:
            arm, stop = _from_config(a)
        else:
            arm, stop = _synthetic(a.emulate, a.servos, a.baud, Path(tmp))
        try:
            yield arm
        finally:
            stop()


def _driver(arm: Arm) -> ServoJoints:
    """The arm's driver, opened (torque off); BenchError saying why it cannot be."""
    warnings: list[str] = []
    context = DriverContext(warn=warnings.append, config_dir=arm.config_dir)
    try:
        d = build_joints(arm.protocol, arm.names, arm.options, context)
        d.open()
    except (DriverFault, ValueError) as exc:
        raise BenchError(f"cannot open the {arm.protocol} bus on {arm.port}: {exc}") from None
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
    for _ in range(warmup):  # (a failed read here is not counted: nothing is measured yet)
        try:
            d.write(d.read().position)
        except DriverFault:
            continue
    cpu0, wall0 = time.process_time(), time.perf_counter()
    end = wall0 + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        try:
            d.write(d.read().position)
        except DriverFault:
            failed += 1
            continue
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
    p.add_argument(
        "--emulate", nargs="?", const="config", choices=(*PROTOCOLS, "config"),
        help="a bus emulator: of PROTOCOL (a synthetic arm), or with --config of its arm",
    )  # fmt: skip
    p.add_argument("--config", type=Path, help="the robot's config (hardware in the loop)")
    p.add_argument("--port", help="with --config: this port instead of the config's")
    p.add_argument("--servos", type=int, help="--emulate PROTOCOL: the synthetic arm's (6)")
    p.add_argument("--baud", type=int, help="--emulate PROTOCOL: the bus's (1000000), one the "
                   "servos have (docs/config.md, joints.options.baud)")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    _check(a)
    return a


def _check(a: argparse.Namespace) -> None:
    """Which source was asked for, and only the options that source takes."""
    if a.config is None:
        if a.port:
            raise BenchError(
                "--port needs --config (the robot's config): the arm's joints, IDs, protocol "
                "and calibration come from it"
            )
        if a.emulate in (None, "config"):
            raise BenchError(
                "name the servos: --emulate dynamixel|feetech, or --config F (real servos; "
                "add --emulate for the config's arm on the emulator)"
            )
        a.servos = 6 if a.servos is None else a.servos
        a.baud = 1_000_000 if a.baud is None else a.baud
        if not 1 <= a.servos <= 32 or a.baud <= 0:
            raise BenchError("--servos must be 1..32 and --baud > 0")
    else:
        given = [o for o, v in (("--servos", a.servos), ("--baud", a.baud)) if v is not None]
        if given:
            raise BenchError(f"{' and '.join(given)}: with --config the config names them")
        if a.port and a.emulate:
            raise BenchError("--port and --emulate: real servos or the emulator, not both")
    if a.seconds <= 0:
        raise BenchError("--seconds must be > 0")


def _measure(a: argparse.Namespace) -> dict[str, Any]:
    """The driver's cycles (and, on an emulator, the raw pty exchange) -> the result."""
    with _arm(a) as arm:
        d = _driver(arm)
        try:
            request, replies, goals = _cycle_bytes(d)
            rtts, failed, cpu, wall = _loop(d, a.seconds, warmup=50)
            fast = d.use_fast_read()
        finally:
            d.close()
        half = a.seconds / 2
        raw = _raw_loop(arm.port, request, replies, goals, half) if arm.emulated else []
    floor_ms = (len(request) + replies + len(goals)) * 10 / arm.baud * 1e3
    return {
        "protocol": arm.protocol,
        "servos": len(arm.names),
        "baud": arm.baud,
        "cycles": len(rtts),
        "rtt_p50_ms": round(_pct(rtts, 50), 3),
        "rtt_p99_ms": round(_pct(rtts, 99), 3),
        "floor_ms": round(floor_ms, 3),
        "rate_hz": round(len(rtts) / wall, 1),
        "cpu_pct": round(100 * cpu / wall, 1),
        "raw_p50_ms": round(_pct(raw, 50), 3) if raw else None,
        "raw_p99_ms": round(_pct(raw, 99), 3) if raw else None,
        "raw_rate_hz": round(len(raw) / half, 1) if raw else None,
        "ratio_vs_raw": ratio(median(rtts), median(raw)) if raw else None,
        "target_ms": round(1.5 * floor_ms + 1, 3),
        "fast_sync_read": fast,
        "failed_reads": failed,
        "arm": arm.label,
    }


def main() -> int:
    a = _parse()
    r = _measure(a)
    rows = [
        ["driver read+write", r["rtt_p50_ms"], r["rtt_p99_ms"], r["rate_hz"], r["cpu_pct"]],
        ["raw pty exchange", r["raw_p50_ms"], r["raw_p99_ms"], r["raw_rate_hz"], None],
        ["wire floor", r["floor_ms"], None, 1e3 / r["floor_ms"], None],
    ]
    title = (
        f"{r['arm']}: {r['protocol']}, {r['servos']} servos, {r['baud']} baud, "
        f"{r['cycles']} cycles{' (FAST_SYNC_READ)' if r['fast_sync_read'] else ''}, "
        f"{r['failed_reads']} failed reads; target p50 <= {r['target_ms']} ms"
    )
    print_table(["", "p50 ms", "p99 ms", "rate Hz", "cpu %"], rows, title=title, digits=3)
    if a.json:
        emit_json(r)
    return 0


if __name__ == "__main__":
    run_main(main)
