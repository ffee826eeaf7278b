"""`robotd calibrate`: make a servo arm's calibration file, next to its config.

    robotd calibrate --config CONFIG                       # walks you through it
    robotd calibrate --config CONFIG --import-lerobot FILE.json [--map JOINT=MOTOR ...]

Walking through: torque goes off; you put the arm in the middle pose and press Enter (each
servo gets the homing offset that makes that pose read a half turn); then each joint in
turn, you move it end to end while a live readout shows min / now / max, and press Enter.
A joint that hardly moved is asked for again (RANGE_TRIES in all) before the walk-through
gives up. The file is written where the config's `joints.options.calibration` says
(relative to the config's directory); an older one is kept as .bak. The arm's port must be
free: a running daemon holds it (exclusively), and is to be stopped first.
"""

from __future__ import annotations

import argparse
import errno
import select
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from drivers.servo.bus import BusError
from drivers.servo.calibration import (
    Calibration,
    CalibrationError,
    JointCalibration,
    resolve_path,
    save_calibration,
)
from drivers.servo.homing import HomingBus
from drivers.servo.lerobot import import_lerobot
from drivers.servo.options import configured_models, wrong_model
from robotd.config import Config, load_config
from robotd.errors import ConfigError

SERVO_DRIVERS = ("dynamixel", "feetech")
MIN_RANGE_TICKS = 20
RANGE_TRIES = 3  # a person may press Enter too soon; not forever
READOUT_S = 0.05


class Operator:
    """The terminal: prompts and the live readout out, Enter in (any readable file)."""

    def __init__(self, inp: TextIO, out: TextIO) -> None:
        self.inp, self.out = inp, out

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def show(self, text: str) -> None:
        self.out.write("\r" + text + "\x1b[K")
        self.out.flush()

    def entered(self, timeout: float) -> bool:
        """True once a line (Enter) has come; EOF is an error: nobody is there."""
        ready, _, _ = select.select((self.inp,), (), (), timeout)
        if not ready:
            return False
        if not self.inp.readline():
            raise CalibrationError("input ended before the calibration was done")
        return True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="robotd calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, required=True, help="the arm's robot config (TOML)")
    p.add_argument(
        "--import-lerobot",
        type=Path,
        metavar="FILE.json",
        help="take the calibration LeRobot wrote for this arm",
    )
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="JOINT=MOTOR",
        help="a LeRobot motor name for a joint named otherwise here",
    )
    p.add_argument("--output", type=Path, help="write here instead of the config's path")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, as robotd run does (e.g. joints.options.port=...)",
    )
    return p


def _target(cfg: Config, config: Path, output: Path | None) -> Path:
    if output is not None:
        return output
    name = str(cfg.joints.options.get("calibration", "calibration.json"))
    return resolve_path(name, config.resolve().parent)


def _write(cal: Calibration, path: Path, op: Operator) -> None:
    if path.exists():
        backup = path.with_name(path.name + ".bak")
        shutil.copyfile(path, backup)
        op.say(f"kept the previous calibration as {backup}")
    save_calibration(cal, path)
    op.say(f"wrote {path}")
    for name, j in cal.joints.items():
        op.say(
            f"  {name:<16} id {j.id:>3}  offset {j.homing_offset:>6}  "
            f"range {j.range_min:>6} .. {j.range_max:<6}  drive mode {j.drive_mode}"
        )


def import_file(cfg: Config, args: argparse.Namespace, op: Operator) -> Calibration:
    mapping = {}
    for item in args.map:
        joint, sep, motor = item.partition("=")
        if not sep or not joint or not motor:
            raise CalibrationError(f"--map {item!r}: expected JOINT=MOTOR")
        mapping[joint] = motor
    cal = import_lerobot(args.import_lerobot, cfg.joints.driver, cfg.joints.names, mapping)
    ids = list(cfg.joints.options.get("ids", []))
    for (name, j), ident in zip(cal.joints.items(), ids):
        if j.id != ident:
            raise CalibrationError(
                f"{args.import_lerobot}: joint {name!r} is servo {j.id} there, {ident} in "
                f"{args.config} (joints.options.ids)"
            )
    return cal


def _watch(
    bus: HomingBus, ids: Sequence[int], names: Sequence[str], op: Operator, focus: int | None = None
) -> tuple[int, int]:
    """Live readout until Enter; (min, max) seen of servo `focus`."""
    lo = hi = None
    while True:
        now = bus.positions(ids)
        if focus is not None:
            p = now[focus]
            lo, hi = (p, p) if lo is None else (min(lo, p), max(hi, p))
            name = names[list(ids).index(focus)]
            op.show(f"{name}: min {lo:>6}  now {p:>6}  max {hi:>6}")
        else:
            op.show("  ".join(f"{n} {now[i]}" for n, i in zip(names, ids)))
        if op.entered(READOUT_S):
            op.out.write("\n")
            return (lo or 0, hi or 0)


def _held(exc: OSError) -> bool:
    """The port could not be opened because another process holds its exclusive lock
    (pyserial's flock failed with EAGAIN; the transport keeps that as the cause)."""
    causes = (exc, exc.__cause__, exc.__context__)
    busy = (errno.EAGAIN, errno.EWOULDBLOCK)
    return any(getattr(c, "errno", None) in busy for c in causes) or (
        "exclusively lock" in str(exc)
    )


def _open(bus: HomingBus, port: str) -> None:
    """Open the arm's bus; a port another process holds is said as such, with what to do."""
    try:
        bus.open()
    except OSError as exc:
        if not _held(exc):
            raise
        raise CalibrationError(
            f"{port} is held by another process, likely the running daemon: stop it first "
            "(systemctl stop robotd, or Ctrl-C the robotd run), then calibrate again"
        ) from None


def _same_models(
    bus: HomingBus, ids: Sequence[int], names: Sequence[str], wants: Sequence[str]
) -> None:
    """CalibrationError, before anything is written, when a servo is not the model
    joints.options.models names for its joint (another arm on this port: calibrating it
    would save its ranges as this arm's); nothing when no models are named."""
    wrong = wrong_model(names, ids, wants, bus.model_names(ids)) if wants else None
    if wrong is not None:
        raise CalibrationError(f"{wrong[1]} Nothing written")


def _joint_range(
    bus: HomingBus, ids: Sequence[int], names: Sequence[str], op: Operator, ident: int
) -> tuple[int, int]:
    """(min, max) of servo `ident` as the person moved it; a range under MIN_RANGE_TICKS
    (Enter pressed before moving it, or the wrong joint moved) is asked for again, each
    try from scratch, RANGE_TRIES in all, then CalibrationError naming the joint."""
    name = names[list(ids).index(ident)]
    op.say(f"Move {name} through its whole range, end to end, then press Enter.")
    for attempt in range(1, RANGE_TRIES + 1):
        lo, hi = _watch(bus, ids, names, op, focus=ident)
        if hi - lo >= MIN_RANGE_TICKS:
            return lo, hi
        if attempt < RANGE_TRIES:
            op.say(
                f"{name} hardly moved ({lo} .. {hi}): move it from one end to the other, "
                f"then press Enter (try {attempt + 1} of {RANGE_TRIES})."
            )
    raise CalibrationError(
        f"{name} hardly moved ({lo} .. {hi}) in {RANGE_TRIES} tries: move it from one end "
        "to the other (is it the joint that moved?); nothing written"
    )


def walk_through(cfg: Config, op: Operator) -> Calibration:
    """The interactive calibration of the arm on cfg's bus."""
    opts, names = cfg.joints.options, cfg.joints.names
    ids = list(opts["ids"])
    bus = HomingBus(
        cfg.joints.driver, str(opts["port"]), int(opts.get("baud", 1_000_000)), warn=op.say
    )
    _open(bus, str(opts["port"]))
    try:
        _same_models(bus, ids, names, configured_models(opts))
        bus.torque_off(ids)
        op.say("Torque is off on every servo: the arm moves by hand now.")
        op.say(
            "Step 1/2: put every joint in the middle of its range (gripper half open), "
            "then press Enter."
        )
        _watch(bus, ids, names, op)
        for i in ids:
            bus.set_homing_offset(i, 0)
        raw = bus.positions(ids)
        offsets = {i: bus.half_turn_offset(raw[i]) for i in ids}
        for i, offset in offsets.items():
            bus.set_homing_offset(i, offset)
        op.say("Step 2/2: each joint's range.")
        joints = {}
        modes = bus.drive_modes(ids)
        for name, i in zip(names, ids):
            lo, hi = _joint_range(bus, ids, names, op, i)
            joints[name] = JointCalibration(
                id=i, homing_offset=offsets[i], drive_mode=modes[i], range_min=lo, range_max=hi
            )
    finally:
        bus.close()
    return Calibration(protocol=cfg.joints.driver, joints=joints, source="robotd calibrate")


def main(
    argv: list[str] | None = None, *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    args = _parser().parse_args(argv)
    op = Operator(stdin or sys.stdin, stdout or sys.stdout)
    try:
        cfg = load_config(args.config, args.overrides)
        if cfg.joints.driver not in SERVO_DRIVERS:
            raise ConfigError(
                f"{args.config}: joints.driver {cfg.joints.driver!r}: only servo "
                f"arms ({', '.join(SERVO_DRIVERS)}) are calibrated"
            )
        target = _target(cfg, args.config, args.output)
        cal = import_file(cfg, args, op) if args.import_lerobot else walk_through(cfg, op)
        _write(cal, target, op)
    except (ConfigError, CalibrationError, BusError, OSError, RuntimeError) as exc:
        print(f"robotd calibrate: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nrobotd calibrate: interrupted, nothing written", file=sys.stderr)
        return 130
    if not args.import_lerobot:
        op.say("the servos hold these homing offsets now; torque stays off")
    else:
        op.say("the servos get these homing offsets when robotd next opens the arm")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
