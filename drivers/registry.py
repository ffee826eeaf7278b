"""Driver lookup by name: the built-in drivers, then the `robotd.joints` and
`robotd.cameras` entry points so that a plugin package can add its own."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from drivers.base import Camera, JointDriver

_BUILTIN_JOINTS = {"sim": "drivers.sim.arm:SimArm"}
_BUILTIN_CAMERAS = {"sim": "drivers.sim.camera:SimCamera"}


def _lookup(name: str, builtin: dict[str, str], group: str, base: type) -> type:
    target = builtin.get(name)
    if target is None:
        found = [ep.value for ep in entry_points(group=group) if ep.name == name]
        target = found[0] if found else None
    if target is None:
        known = sorted(set(builtin) | {ep.name for ep in entry_points(group=group)})
        raise LookupError(f"unknown driver {name!r} (known: {', '.join(known)})")
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise LookupError(f"driver {name!r} ({target}) cannot be loaded: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise LookupError(f"driver {name!r} ({target}) is not a {base.__name__}")
    return cls


def joint_driver_class(name: str) -> type[JointDriver]:
    """The JointDriver class registered as `name`; LookupError names the known ones."""
    return _lookup(name, _BUILTIN_JOINTS, "robotd.joints", JointDriver)


def camera_class(name: str) -> type[Camera]:
    """The Camera class registered as `name`; LookupError names the known ones."""
    return _lookup(name, _BUILTIN_CAMERAS, "robotd.cameras", Camera)
