"""The driver contract: what the control lane and the camera processes rely on.

A joint driver is read and written once per control tick from the control process's
loop thread (ros2_control's read → update → write); a camera runs in a process of its
own and writes frames into a `FrameSink` (the shared-memory frame ring). Both raise
`DriverFault` for anything that must stop motion; the caller holds and latches FAULT.

Every driver declares its options as a pydantic model (`Options`, a subclass of
`DriverOptions`) and is built from config through one factory (`build_joints`,
`build_camera`), which looks the driver up by name (the built-ins, then the
`robotd.joints` / `robotd.cameras` entry points of plugin packages), validates its
options and hands it a `DriverContext`. Nothing else of the runtime reaches a driver:
a driver family that shares state between processes (the simulator's world) keeps it
to itself, under the context's `shm_prefix`.
"""

from __future__ import annotations

import importlib
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
import pydantic

BUILTIN_JOINTS = {
    "sim": "drivers.sim.arm:SimArm",
    "dynamixel": "drivers.dynamixel.driver:DynamixelJoints",
    "feetech": "drivers.feetech.driver:FeetechJoints",
}
BUILTIN_CAMERAS = {
    "sim": "drivers.sim.camera:SimCamera",
    "opencv": "drivers.opencv.camera:OpenCVCamera",
}


class DriverFault(Exception):
    """A driver can no longer be trusted: the control lane holds and latches FAULT.

    `joint` names the joint (or camera) at fault where one is known.
    """

    def __init__(self, message: str, *, joint: str | None = None) -> None:
        super().__init__(message)
        self.joint = joint


class DriverConfigError(ValueError):
    """A driver name or its options are wrong; the message names the config key."""


class DriverOptions(pydantic.BaseModel):
    """Base of every driver's `Options`: unknown keys are errors, values immutable, and
    nothing converted from another kind (strict, as the config's own sections: a TOML bool
    is no number, a string no bool, a float no integer; an integer is a float's value).

    Strict mode covers a union too (`int | str` takes neither a bool nor a float), but says
    so once per member: a union field of a built-in driver refuses other kinds itself, in
    one rule (`exact_kind`). A plugin whose options hold a type strict mode refuses from
    every TOML value (a tuple from an array, a Path or an Enum from a string) sets
    ``model_config = pydantic.ConfigDict(strict=False)`` on its model; the config loader
    still refuses a scalar of the wrong kind there (robotd.config.strict)."""

    # NaN or infinity is never a setting (a bound compared with NaN is always false)
    model_config = pydantic.ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, strict=True
    )


def exact_kind(value: Any, kinds: tuple[type, ...], said: str) -> Any:
    """`value` when it is of one of `kinds` itself, else ValueError "must be SAID, got V"
    (a field validator in mode="before": a bool is an int to Python, and a Literal of
    integers takes 3.0 for 3 even in strict mode)."""
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise ValueError(f"must be {said}, got {value!r:.60}")
    return value


def _sleep_until(deadline_ns: int) -> bool:
    delay = (deadline_ns - time.monotonic_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)
    return True


@dataclass(frozen=True)
class DriverContext:
    """What the runtime hands a driver besides its options.

    clock: integer ns, monotonic (the virtual clock in tests and benchmarks).
    sleep_until(deadline_ns): sleeps on that clock; returns False if `stop` was set
      meanwhile (the caller then returns promptly). A custom clock needs its own.
    stop: set when the process is stopping (a driver blocked on a device looks at it).
    shm_prefix: a name prefix for shared memory this run owns and unlinks at exit
      (robotd.shm); None when the driver runs in one process only (virtual clock, tests).
    config_dir: the directory of the robot's config file (calibration files live there).
    warn: one-line warnings (logged by the caller with the driver's name).
    """

    clock: Callable[[], int] = time.monotonic_ns
    sleep_until: Callable[[int], bool] = _sleep_until
    stop: threading.Event | None = None
    shm_prefix: str | None = None
    config_dir: Path | None = None
    warn: Callable[[str], None] = lambda message: None

    def stopping(self) -> bool:
        return self.stop is not None and self.stop.is_set()


@dataclass(slots=True)
class JointState:
    """One read of every joint, in the driver's joint order (SI units: rad, rad/s; a
    gripper 0..1), float64 arrays."""

    position: np.ndarray
    velocity: np.ndarray
    effort: np.ndarray
    read_time_ns: int  # the context clock when the read completed


@dataclass(slots=True)
class JointCounters:
    """Transport trouble of one joint (cumulative)."""

    timeouts: int = 0  # no (complete) reply within the deadline
    checksum: int = 0  # a reply whose checksum or CRC did not match
    error_bits: int = 0  # a reply whose status/error byte flagged a problem
    retries: int = 0  # transactions repeated within the tick
    watchdog_trips: int = 0  # the servo stopped itself (bus quiet too long), re-armed


@dataclass(slots=True)
class DriverStats:
    """Per-joint counters of transport trouble, reported in the tick statistics."""

    joints: dict[str, JointCounters] = field(default_factory=dict)

    def to_wire(self) -> dict[str, dict[str, int]]:
        """{joint: {counter: n}} with only the nonzero counters (cheap when all is well)."""
        out = {}
        for name, c in self.joints.items():
            nonzero = {
                k: v
                for k, v in (
                    ("timeouts", c.timeouts),
                    ("checksum", c.checksum),
                    ("error_bits", c.error_bits),
                    ("retries", c.retries),
                    ("watchdog_trips", c.watchdog_trips),
                )
                if v
            }
            if nonzero:
                out[name] = nonzero
        return out


class JointDriver(ABC):
    """A set of joints read and commanded together, once per control tick.

    Built as ``cls(names, options, context)`` by `build_joints`.

    Contract:
    - `open()` connects and leaves torque off; it raises DriverFault if the hardware is
      absent or refuses (a missing calibration, a servo that does not answer).
    - `read()` returns the state of every joint; it retries transport errors within its
      own budget (a fraction of a tick) and raises DriverFault when a read fails; the
      caller counts failed ticks and faults after a run of them.
    - `write(targets)` commands one target per joint (same order as `names`, float64,
      finite, within limits: the shield checked it); it must not block for longer than
      a small fraction of a tick.
    - `torque(on)` enables or disables holding torque on every joint; enabling holds the
      present position (nothing jumps).
    - `close()` is idempotent and never raises; it leaves the joints safe (torque off
      unless the device holds by itself).
    """

    Options: ClassVar[type[DriverOptions]] = DriverOptions
    names: tuple[str, ...]

    @abstractmethod
    def open(self) -> None: ...

    @abstractmethod
    def read(self) -> JointState: ...

    @abstractmethod
    def write(self, targets: np.ndarray) -> None: ...

    @abstractmethod
    def torque(self, on: bool) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @classmethod
    def check_options(cls, names: Sequence[str], options: DriverOptions) -> None:
        """The validated options against the joints they drive (one value per joint, ...),
        at config load, before anything is opened: ValueError ``"OPTION: what is wrong"``
        (the config names it joints.options.OPTION). The constructor checks the same."""
        return None  # the default: nothing to check against the joints

    def stats(self) -> DriverStats:
        """Transport counters; drivers without a transport report none."""
        return DriverStats()

    def ground_truth(self) -> dict[str, float]:
        """Simulated robots report task metrics (e.g. tracking_error); real ones nothing."""
        return {}


class FrameSink(Protocol):
    """Where a camera puts its frames (the shared-memory frame ring, or a test's list).

    One writer. `begin()` hands a writable (height, width, 3) uint8 RGB view of the next
    slot; the camera fills it and calls `commit(capture_time_ns)`, which publishes the
    frame and returns its index, or `abort()` for a bad frame (nothing is published).
    `write(frame, t)` copies a whole frame in (begin + copy + commit).
    """

    shape: tuple[int, int, int]

    def begin(self) -> np.ndarray: ...

    def commit(self, capture_time_ns: int) -> int: ...

    def abort(self) -> None: ...

    def write(self, frame: np.ndarray, capture_time_ns: int) -> int: ...


@dataclass(frozen=True)
class CameraSpec:
    """A camera's configured geometry: every frame it writes is (height, width, 3)."""

    name: str
    width: int
    height: int
    fps: float

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, 3)


class Camera(ABC):
    """A camera that captures frames into a FrameSink, in a process of its own.

    Built as ``cls(spec, options, context)`` by `build_camera`.

    Contract:
    - `open()` starts the device and raises DriverFault if it cannot.
    - `shape` is spec.shape: (height, width, 3) uint8 RGB, every frame it writes (a
      device that delivers another size is fitted to it).
    - `capture(sink)` blocks until the next frame (at most about a frame period, or
      returns early when the context's stop is set), writes it into the sink with its
      capture time (the context clock, ns) and returns the frame index the sink gave it.
      A bad frame is not written: raise any exception (counted and skipped by the
      caller) or DriverFault when the camera is gone for good.
    - `close()` is idempotent and never raises.
    """

    Options: ClassVar[type[DriverOptions]] = DriverOptions
    spec: CameraSpec

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.spec.shape

    @abstractmethod
    def open(self) -> None: ...

    @abstractmethod
    def capture(self, sink: FrameSink) -> int: ...

    @abstractmethod
    def close(self) -> None: ...


# ---- the factory ---------------------------------------------------------------------------

D = TypeVar("D", JointDriver, Camera)


def driver_class(kind: str, name: str) -> type:
    """The class registered as `name` for `kind` ("joints" or "cameras"): the built-ins,
    then the `robotd.<kind>` entry points. DriverConfigError names the known ones."""
    builtin, base = (
        (BUILTIN_JOINTS, JointDriver) if kind == "joints" else (BUILTIN_CAMERAS, Camera)
    )
    group = f"robotd.{kind}"
    target = builtin.get(name)
    if target is None:
        found = [ep.value for ep in entry_points(group=group) if ep.name == name]
        target = found[0] if found else None
    if target is None:
        known = sorted(set(builtin) | {ep.name for ep in entry_points(group=group)})
        raise DriverConfigError(f"unknown driver {name!r} (known: {', '.join(known)})")
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise DriverConfigError(f"driver {name!r} ({target}) cannot be loaded: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise DriverConfigError(f"driver {name!r} ({target}) is not a {base.__name__}")
    options = getattr(cls, "Options", None)
    if not (isinstance(options, type) and issubclass(options, DriverOptions)):
        raise DriverConfigError(f"driver {name!r} ({target}) declares no DriverOptions model")
    return cls


def validate_options(cls: type[D], options: Mapping[str, Any]) -> DriverOptions:
    """The driver's options validated by its own model; pydantic.ValidationError if bad
    (the caller formats it with the config key)."""
    return cls.Options.model_validate(dict(options))


def check_joint_options(cls: type, names: Sequence[str], options: DriverOptions) -> None:
    """A joint driver's validated options against its joint names (ValueError: see
    JointDriver.check_options)."""
    if issubclass(cls, JointDriver):
        cls.check_options(tuple(names), options)


def build_joints(
    driver: str, names: Sequence[str], options: Mapping[str, Any], context: DriverContext
) -> JointDriver:
    """The configured joint driver, constructed (not opened). DriverConfigError for an
    unknown driver or bad options (naming them), ValueError from the driver's own checks."""
    cls = driver_class("joints", driver)
    return cls(tuple(names), _options(cls, driver, options, "joints.options"), context)


def build_camera(
    driver: str, spec: CameraSpec, options: Mapping[str, Any], context: DriverContext
) -> Camera:
    """The configured camera, constructed (not opened); errors as for build_joints."""
    cls = driver_class("cameras", driver)
    return cls(spec, _options(cls, driver, options, f"cameras.{spec.name}.options"), context)


def _options(cls: type, driver: str, options: Mapping[str, Any], where: str) -> DriverOptions:
    try:
        return validate_options(cls, options)
    except pydantic.ValidationError as exc:
        from robotd.errors import validation_lines

        lines = validation_lines(exc, prefix=where)
        raise DriverConfigError(f"driver {driver!r}: " + "; ".join(lines)) from None
