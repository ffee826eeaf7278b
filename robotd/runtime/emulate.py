"""`robotd run --emulate`: a real arm's config run on this machine, without the arm.

The servo bus emulator (drivers.emulators) is started on a pty with the config's servo IDs
and baud rate; the config is pointed at it (`joints.options.port`) and at a calibration of
the emulated arm (its shafts start mid-range: 0 rad, grippers half open), written in a
temporary directory named by the daemon's pid (one a killed daemon left is removed by the
next `--emulate` start, as the shared memory of dead pids is); OpenCV cameras fall back to
a test pattern when no device exists.
The emulator is a program sharing the machine's CPUs, not a servo answering in hardware:
unless the config sets them, a tick's reads wait EMULATED_TIMEOUT_MS for each reply
(`timeout_ms`) and up to BUDGET_SHARE of the tick in all (`budget_ms`), so that a busy
machine does not fault the emulated arm. Everything else (shield, latching, the policy) is
the config's own.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from drivers.emulators.launch import start_emulator
from drivers.servo.calibration import Calibration, JointCalibration, save_calibration
from drivers.servo.options import configured_models
from robotd.config import Config
from robotd.errors import ConfigError

EMULATED = ("dynamixel", "feetech")
CENTRE = 2048
MARGIN_TICKS = 64
GRIPPER_HALF_RANGE = 512
EMULATED_TIMEOUT_MS = 10.0
BUDGET_SHARE = 0.8


def emulated_calibration(cfg: Config) -> Calibration:
    """Ranges that hold each joint's limits, centred where the emulated shafts start."""
    scale = 2 * math.pi / 4096
    opts = cfg.joints.options
    joints = {}
    for name, ident, lo, hi in zip(
        cfg.joints.names, opts["ids"], cfg.joints.lower, cfg.joints.upper
    ):
        if name in cfg.joints.grippers:
            half = GRIPPER_HALF_RANGE
        else:
            half = min(CENTRE - 1, math.ceil(max(abs(lo), abs(hi)) / scale) + MARGIN_TICKS)
        joints[name] = JointCalibration(
            id=ident, homing_offset=0, range_min=CENTRE - half, range_max=CENTRE + half
        )
    return Calibration(protocol=cfg.joints.driver, joints=joints, source="robotd run --emulate")


TMP_PREFIX = "robotd-emulate-"
_TMP_NAME = re.compile(re.escape(TMP_PREFIX) + r"(\d+)-\w+")


def remove_stale_emulations(root: Path | None = None) -> list[Path]:
    """Remove the temporary directories of `--emulate` runs whose daemon is dead (killed,
    it could not remove its own): only directories this user owns, named by a pid that
    no longer runs. The ones removed."""
    root = Path(tempfile.gettempdir()) if root is None else root
    gone = []
    for path in root.glob(f"{TMP_PREFIX}*"):
        match = _TMP_NAME.fullmatch(path.name)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


def start_emulation(cfg: Config) -> tuple[list[str], Callable[[], None]]:
    """Start the emulator for `cfg`'s arm: the `--set` overrides that point the config at
    it, and the callback that stops it (and removes its calibration). ConfigError when the
    config's driver has no emulator; RuntimeError when the emulator fails to start."""
    driver = cfg.joints.driver
    if driver not in EMULATED:
        raise ConfigError(
            f"--emulate: joints.driver {driver!r} has no bus emulator (there is one for "
            f"{', '.join(EMULATED)}); a simulated arm needs none"
        )
    opts = cfg.joints.options
    ids = opts.get("ids")
    if not isinstance(ids, list) or len(ids) != len(cfg.joints.names):
        raise ConfigError("--emulate: joints.options.ids: one servo ID per joint")
    remove_stale_emulations()
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
    try:
        calibration = tmp / "calibration.json"
        save_calibration(emulated_calibration(cfg), calibration)
        # the arm's own models, so that the driver's check at open passes
        models = configured_models(opts) or None
        emulator = start_emulator(
            driver, ids, baud=int(opts.get("baud", 1_000_000)), model=models
        )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    overrides = [
        f"joints.options.port={json.dumps(emulator.port)}",
        f"joints.options.calibration={json.dumps(str(calibration))}",
    ]
    if "timeout_ms" not in opts:
        overrides.append(f"joints.options.timeout_ms={EMULATED_TIMEOUT_MS}")
    if "budget_ms" not in opts:
        budget_ms = round(BUDGET_SHARE * 1e3 / cfg.control.hz, 2)
        overrides.append(f"joints.options.budget_ms={budget_ms}")
    for name, cam in cfg.cameras.items():
        if cam.driver == "opencv" and cam.options.get("fallback", "none") == "none":
            overrides.append(f'cameras.{name}.options.fallback="pattern"')

    def stop() -> None:
        emulator.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    return overrides, stop
