"""Driver lookup by name: the built-in drivers, then the `robotd.joints` and
`robotd.cameras` entry points so that a plugin package can add its own."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

_BUILTIN_JOINTS = {"sim": "drivers.sim.arm:SimArm"}
_BUILTIN_CAMERAS = {"sim": "drivers.sim.camera:SimCamera"}


def _load(spec: str) -> type:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def _lookup(name: str, builtin: dict[str, str], group: str) -> type:
    if name in builtin:
        return _load(builtin[name])
    for ep in entry_points(group=group):
        if ep.name == name:
            return ep.load()
    known = sorted(set(builtin) | {ep.name for ep in entry_points(group=group)})
    raise LookupError(f"unknown driver {name!r} (known: {', '.join(known)})")


def joint_driver_class(name: str) -> type:
    """The JointDriver class registered as `name`; LookupError names the known ones."""
    return _lookup(name, _BUILTIN_JOINTS, "robotd.joints")


def camera_class(name: str) -> type:
    """The Camera class registered as `name`; LookupError names the known ones."""
    return _lookup(name, _BUILTIN_CAMERAS, "robotd.cameras")
