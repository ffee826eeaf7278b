"""The sections of a robot's config file, one model each: robot, control, joints, safety,
cameras, runtime. The policy section's model is robotd.config.policy, the trace section's
robotd.trace.options; what the models are built of (the base model, the shared field types)
is robotd.config.fields."""

from __future__ import annotations

import math
import os
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from drivers.base import exact_kind
from robotd.config.fields import (
    ConfigModel,
    FiniteFloat,
    Name,
    SafetyLimit,
    known_driver,
    no_duplicates,
)
from robotd.config.problems import Problem, raise_any

# Validation context key: False when the process validating runs no camera. The control
# lane re-validates the config the main process loaded, and a camera driver's module
# imports OpenCV: ~140 MB of mappings the lane's mlockall would lock, for nothing.
CAMERA_DRIVERS = "camera_drivers"


class RobotConfig(ConfigModel):
    name: str = "robot"
    # latched: FAULT with the e-stop latched (every real robot); idle: no motion until
    # `start`; episode: the first episode starts by itself (simulated robots only).
    start: Literal["latched", "idle", "episode"] = "latched"


MIN_HZ = 1  # control.hz
# The robot's patience, control.max_hold_steps / control.hz: ten minutes of holding, the
# cap of every wait the config sets (policy.timeout_s, stream_wait_s, hang_s). A policy
# silent longer is gone, not slow: more is a typo (30000 for 300 holds 16 min at 30 Hz).
PATIENCE_MAX_S = 600.0


class ControlConfig(ConfigModel):
    hz: float = Field(30.0, gt=0, le=2000)  # and at least MIN_HZ (_hz)
    spin_us: int = Field(200, ge=0, le=5000)
    rt_priority: int = Field(80, ge=0, le=99)
    lock_memory: bool = True
    timing: Literal["sync", "realtime"] = "sync"
    clock: Literal["wall", "virtual"] = "wall"
    # realtime: ask when at most this many rows remain; "auto": when they fall to the
    # predicted ask → chunk delay plus delay_margin_steps
    refill_steps: int | Literal["auto"] = "auto"
    # the predicted delay (rtc's d): this quantile of the recent acts' delays, >= 1 step
    delay_quantile: float = Field(0.9, gt=0, le=1)
    delay_margin_steps: int = Field(1, ge=0, le=1000)  # auto refill: steps on top of it
    merge: Literal["replace", "fade", "ensemble"] = "replace"
    # realtime: drop a late chunk's rows for steps already past; false = the naive baseline
    # (rows play from the chunk's start, late), for benchmarks only
    aligned: bool = True
    fade_steps: int = Field(5, ge=1)
    # ensemble weight exp(-decay * i) per chunk, i = 0 the oldest (control/queue.py). At 10
    # each newer chunk weighs e^-10 = 4.5e-5 of the one before (ACT uses 0.01): no average is
    # left, and past ~36 a newer chunk adds exactly nothing in float64. More is a typo.
    ensemble_decay: float = Field(0.1, ge=0, le=10)
    # virtual clock: fixed policy latency (None = measured), the stand-in for an act's round
    # trip: a minute is far past any policy a robot waits for (and the default patience, 10 s)
    latency_s: float | None = Field(None, ge=0, le=60)
    max_hold_steps: int = Field(300, ge=1)  # at most PATIENCE_MAX_S of holds (_patience)
    max_steps: int = Field(0, ge=0)  # 0 = no limit
    control_mode: Literal["absolute", "delta", "velocity"] = "absolute"
    # a worker-side episode reset: flush the queue and hold until the new episode's first
    # chunk, or let the queued rows finish
    on_reset: Literal["hold", "finish_chunk"] = "hold"
    # how often the lane reports its counters (status, telemetry); the main process calls the
    # lane silent after 8 of these periods (runtime/view.py): past 10 s a dead lane would go
    # unnoticed for over a minute
    stats_interval_s: float = Field(0.25, gt=0, le=10)
    # the main process gone: the lane holds in FAULT this long, then applies its e-stop
    # category and exits (a restarted daemon starts latched)
    orphan_s: float = Field(2.0, ge=0, le=60)
    # the main process silent (stopped, hung) this long: FAULT, orphan_s held, the e-stop
    main_silent_s: float = Field(5.0, ge=0.5, le=60)

    @field_validator("hz")
    @classmethod
    def _hz(cls, value: float) -> float:
        # a slower "loop" is no control loop, and what is derived from the period (its ns,
        # the seconds of patience) overflows below it
        if value < MIN_HZ:
            raise ValueError(f"must be >= {MIN_HZ} (a control rate in Hz), got {value!r}")
        return value

    @model_validator(mode="after")
    def _patience(self) -> ControlConfig:
        """The robot's patience, max_hold_steps / hz, at most PATIENCE_MAX_S (the rule is
        about both keys: a --set of either is to blame)."""
        most = math.floor(PATIENCE_MAX_S * self.hz)
        if self.max_hold_steps > most:
            text = (
                f"must be at most {most} at control.hz = {self.hz:g} ({PATIENCE_MAX_S:g} s "
                f"of holds), got {self.max_hold_steps} ({self.max_hold_steps / self.hz:.5g} "
                "s): a policy silent that long is gone, not slow"
            )
            raise_any([(("max_hold_steps", "hz"), text)])
        return self

    @field_validator("refill_steps", mode="before")
    @classmethod
    def _refill(cls, value: Any) -> Any:
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value == "auto" or (whole and value >= 0):
            return value
        raise ValueError(f"must be 'auto' or an integer >= 0, got {value!r:.60}")


class JointsConfig(ConfigModel):
    driver: str = "sim"
    names: list[Name] = Field(min_length=1)
    grippers: list[Name] = []
    lower: list[FiniteFloat]
    upper: list[FiniteFloat]
    options: dict[str, Any] = {}

    @field_validator("driver")
    @classmethod
    def _driver(cls, value: str) -> str:
        return known_driver("joints", value)

    @field_validator("names")
    @classmethod
    def _unique_names(cls, value: list[str]) -> list[str]:
        return no_duplicates("joint name", value)

    @field_validator("grippers")
    @classmethod
    def _unique_grippers(cls, value: list[str]) -> list[str]:
        return no_duplicates("gripper", value)

    @model_validator(mode="after")
    def _consistent(self) -> JointsConfig:
        n = len(self.names)
        problems: list[Problem] = []
        for key in ("lower", "upper"):
            got = len(getattr(self, key))
            if got != n:
                problems.append(((key, "names"), f"needs one value per joint ({n}), got {got}"))
        if not problems:
            for i, (lo, hi) in enumerate(zip(self.lower, self.upper)):
                if not lo < hi:
                    text = f"joint {self.names[i]!r} has lower {lo:g} >= upper {hi:g}"
                    problems.append(((f"lower[{i}]", f"upper[{i}]"), text))
        unknown = [g for g in self.grippers if g not in self.names]
        if unknown:
            text = f"{unknown} are not joint names {self.names}"
            problems.append((("grippers", "names"), text))
        raise_any(problems)
        return self

    def gripper_indices(self) -> tuple[int, ...]:
        return tuple(self.names.index(g) for g in self.grippers)


class SafetyConfig(ConfigModel):
    # out of limits by at most this → clipped (0: nothing is clipped, all rejected)
    clip_tolerance: float = Field(0.05, ge=0, allow_inf_nan=False)
    max_velocity: list[SafetyLimit] | None = None  # per joint, units/s; None = no limit
    max_acceleration: list[SafetyLimit] | None = None  # per joint, units/s²
    reject_run: int = Field(5, ge=1)  # this many rejected actions in a row latch FAULT
    estop_category: Literal[0, 1] = 1
    driver_fault_run: int = Field(3, ge=1)  # consecutive failed ticks before the driver is faulted

    @field_validator("estop_category", mode="before")
    @classmethod
    def _category(cls, value: Any) -> Any:
        # a Literal of integers takes true for 1 and 0.0 for 0, even strictly
        return exact_kind(value, (int,), "an integer (0 or 1)")


MAX_AGE_MS = 10_000  # cameras.NAME.max_age_ms's bound


class CameraConfig(ConfigModel):
    driver: str = "sim"
    width: int = Field(gt=0, le=8192)
    height: int = Field(gt=0, le=8192)
    fps: float = Field(gt=0, le=1000)
    # a newest frame older than this makes the observation invalid (control/record.py): one
    # 10 s old no longer shows the scene the robot acts in (200000 for 200 would let acts run
    # on a frozen camera); at least one frame period (model.py)
    max_age_ms: float = Field(200.0, gt=0, le=MAX_AGE_MS)
    ring_seconds: float = Field(2.0, gt=0, le=60)
    options: dict[str, Any] = {}

    @field_validator("driver")
    @classmethod
    def _driver(cls, value: str, info: ValidationInfo) -> str:
        if (info.context or {}).get(CAMERA_DRIVERS) is False:
            return value  # a process that runs no camera (the control lane)
        return known_driver("cameras", value)



# The longest socket name robotd makes in the run directory, and the kernel's limit on
# a unix socket path (sun_path, 108 bytes with its NUL).
_LONGEST_SOCKET = "/worker-4194304-o.sock"
_SUN_PATH_MAX = 107


class RuntimeConfig(ConfigModel):
    dir: str = ""  # empty = $RUNTIME_DIRECTORY, $XDG_RUNTIME_DIR/robotd or /tmp/robotd-<uid>
    control_endpoint: str = ""  # operator socket; empty = ipc://<dir>/control.sock
    telemetry_endpoint: str = ""  # empty = ipc://<dir>/telemetry.sock
    telemetry_hz: float = Field(10.0, gt=0, le=100)
    # Over tcp the operator sockets are CURVE servers (`robotctl keygen` makes the files):
    curve_secret_key: str = ""  # the daemon's key pair: a zmq .key_secret file
    curve_clients: str = ""  # directory of the authorised clients' public .key files

    @model_validator(mode="after")
    def _endpoints_served(self) -> RuntimeConfig:
        for key in ("control_endpoint", "telemetry_endpoint"):
            ep = getattr(self, key)
            if not ep or ep.startswith("ipc://"):
                continue
            if not ep.startswith("tcp://"):
                raise ValueError(f"{key}: {ep!r}: only ipc:// and tcp:// endpoints are served")
            if not (self.curve_secret_key and self.curve_clients):
                raise ValueError(
                    f"{key}: {ep!r} is tcp, which is served only with CURVE keys: set "
                    "runtime.curve_secret_key and runtime.curve_clients (robotctl keygen)"
                )
        return self

    @field_validator("dir")
    @classmethod
    def _socket_paths_fit(cls, value: str) -> str:
        longest = len(os.fsencode(value)) + len(_LONGEST_SOCKET)
        if value and longest > _SUN_PATH_MAX:
            raise ValueError(
                f"{value!r} is too long for the ipc sockets robotd makes in it "
                f"({longest} > {_SUN_PATH_MAX} bytes); choose a shorter run directory"
            )
        return value
