"""`robotd check`: what start-up would refuse besides the config's own rules (a run
directory that cannot be made or is not the daemon's own, a camera source that can never
deliver: its driver's `preflight`), then the resolved config. Each problem names its key
and source as load's own errors do (`Loaded.blame`: the --set that gave the key or made
its table, else the file)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from robotd.config import Loaded


def check(loaded: Loaded) -> int:
    """Exit 2 with one line per problem, else print the resolved config and exit 0."""
    from robotd.config import runtime_dir
    from robotd.runtime.rundir import RunDirError, check_run_dir

    try:
        check_run_dir(runtime_dir(loaded.config))
    except RunDirError as exc:
        why = str(exc).removeprefix("runtime.dir ")
        print(f"robotd: {loaded.blame('runtime.dir')}: {why}", file=sys.stderr)
        return 2
    problems = camera_problems(loaded)
    for line in problems:
        print(f"robotd: {line}", file=sys.stderr)
    if problems:
        return 2
    print(json.dumps(loaded.config.model_dump(mode="json"), indent=2))
    return 0


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
