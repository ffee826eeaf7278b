"""`robotd check`: what start-up would refuse besides the config's own rules (a run
directory that cannot be made or is not the daemon's own; a camera source that can never
deliver, an arm's port that names no device or a calibration missing or not this arm's:
the driver's `preflight`; a local worker's policy that cannot be found), then the
resolved config. Each problem names its key and source as load's own errors do
(`Loaded.blame`: the --set that gave the key or made its table, else the file). Nothing
is opened or moved: check runs beside the daemon it is about to replace. `--probe` is the
exception, asked for by name: it opens the arm's port and reads (never writes) its servos
(robotd.check_probe)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from robotd.config import Loaded


@dataclass(frozen=True)
class Probe:
    """`check --probe`: scan the bus for the IDs that answer when one is missing (not with
    --no-scan); print JSON (--json) rather than a table."""

    scan: bool = True
    as_json: bool = False


def check(loaded: Loaded, probe: Probe | None = None) -> int:
    """Exit 2 with one line per problem, else print the resolved config and exit 0. With
    `probe` the servo arm's bus is read after the config's problems are known instead
    (robotd.check_probe), nothing written."""
    from robotd.config import runtime_dir
    from robotd.runtime.rundir import RunDirError, check_run_dir

    try:
        check_run_dir(runtime_dir(loaded.config))
    except RunDirError as exc:
        why = str(exc).removeprefix("runtime.dir ")
        print(f"robotd: {loaded.blame('runtime.dir')}: {why}", file=sys.stderr)
        return 2
    from robotd.check_policy import openpi_problem, policy_problem

    problems = joint_problems(loaded) + camera_problems(loaded)
    problems += [p for p in (policy_problem(loaded), openpi_problem(loaded)) if p is not None]
    if probe is not None:
        from robotd.check_probe import probe_check

        return probe_check(loaded, problems, scan=probe.scan, as_json=probe.as_json)
    for line in problems:
        print(f"robotd: {line}", file=sys.stderr)
    if problems:
        return 2
    print(json.dumps(loaded.config.model_dump(mode="json"), indent=2))
    return 0


def joint_problems(loaded: Loaded) -> list[str]:
    """What the joint driver's `preflight` (a classmethod, given the joint names, the
    options as load validated them and the config's directory; the servo arms':
    drivers.servo.preflight) says, as lines of `SOURCE: KEY: why`. Its lines are "KEY,
    KEY: why": options of the driver, or "names" / "driver" of the joints table; the first
    key is named, blamed on a --set of any of them (`Loaded.blame_keys`, as load does)."""
    from drivers.base import driver_class

    joints = loaded.config.joints
    preflight = getattr(driver_class("joints", joints.driver), "preflight", None)
    if preflight is None or loaded.joint_options is None:
        return []
    config_dir = Path(loaded.where).resolve().parent
    problems = []
    for line in preflight(joints.names, loaded.joint_options, config_dir):
        keys, _, why = line.partition(": ")
        named = [
            f"joints.{k}" if k in ("names", "driver") else f"joints.options.{k}"
            for k in keys.split(", ")
        ]
        problems.append(f"{loaded.blame_keys(named)}: {why}")
    return problems


def camera_problems(loaded: Loaded) -> list[str]:
    """Each camera whose source can never deliver: what its driver's `preflight` says (a
    classmethod, given the options as load validated them and the config's directory;
    opencv's: drivers.opencv.options), as lines of `SOURCE: cameras.NAME.options.KEY:
    why`."""
    from drivers.base import driver_class

    config_dir = Path(loaded.where).resolve().parent
    problems = []
    for name, cam in loaded.config.cameras.items():
        preflight = getattr(driver_class("cameras", cam.driver), "preflight", None)
        if preflight is None:
            continue
        problem = preflight(loaded.camera_options[name], config_dir)
        if problem is None:
            continue
        field, _, why = problem.partition(":")
        problems.append(f"{loaded.blame(f'cameras.{name}.options.{field}')}:{why}")
    return problems
