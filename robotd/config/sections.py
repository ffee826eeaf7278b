"""The sections of a robot's config file, one model each: robot, control, joints, safety,
cameras, policy, runtime (the trace section's model is robotd.trace.options)."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from robotd.link.openpi.options import OpenpiOptions
from robotd.stream.endpoint import EndpointError, is_stream, port_problem
from robotd.stream.endpoint import parse as parse_stream

PositiveFloat = Annotated[float, Field(gt=0)]
# A safety limit: NaN would make every comparison false (and the shield's clamp emit NaN),
# inf no limit at all, zero or less a robot that cannot move.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
SafetyLimit = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Model(BaseModel):
    # every float finite: NaN fails every bound silently, infinity overflows what is derived
    # from it (the loader also refuses both before any model sees them: config.overrides)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _known_driver(kind: str, name: Any) -> Any:
    """A driver name that names a driver (a built-in or a plugin's entry point), checked
    with its section so that a typo is reported as such, before the rules that span
    sections (robot.start's 'simulated robots only')."""
    from drivers.base import DriverConfigError, driver_class

    if isinstance(name, str):
        try:
            driver_class(kind, name)
        except DriverConfigError as exc:
            raise ValueError(str(exc)) from None
    return name


_DOTTED = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*"
POLICY_SPEC = re.compile(f"{_DOTTED}:{_DOTTED}")


class RobotConfig(_Model):
    name: str = "robot"
    # latched: FAULT with the e-stop latched (every real robot); idle: no motion until
    # `start`; episode: the first episode starts by itself (simulated robots only).
    start: Literal["latched", "idle", "episode"] = "latched"


MIN_HZ = 1  # control.hz


class ControlConfig(_Model):
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
    ensemble_decay: float = Field(0.1, ge=0)
    latency_s: float | None = Field(
        None, ge=0
    )  # virtual clock: fixed policy latency; None = measured
    max_hold_steps: int = Field(300, ge=1)
    max_steps: int = Field(0, ge=0)  # 0 = no limit
    control_mode: Literal["absolute", "delta", "velocity"] = "absolute"
    # a worker-side episode reset: flush the queue and hold until the new episode's first
    # chunk, or let the queued rows finish
    on_reset: Literal["hold", "finish_chunk"] = "hold"
    stats_interval_s: float = Field(0.25, gt=0)
    # the main process gone: the lane holds in FAULT this long, then applies its e-stop
    # category and exits (a restarted daemon starts latched)
    orphan_s: float = Field(2.0, ge=0, le=60)

    @field_validator("hz")
    @classmethod
    def _hz(cls, value: float) -> float:
        # a slower "loop" is no control loop, and what is derived from the period (its ns,
        # the seconds of patience) overflows below it
        if value < MIN_HZ:
            raise ValueError(f"must be >= {MIN_HZ} (a control rate in Hz), got {value!r}")
        return value

    @field_validator("refill_steps", mode="before")
    @classmethod
    def _refill(cls, value: Any) -> Any:
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value == "auto" or (whole and value >= 0):
            return value
        raise ValueError(f"must be 'auto' or an integer >= 0, got {value!r:.60}")


class JointsConfig(_Model):
    driver: str = "sim"
    names: list[str] = Field(min_length=1)
    grippers: list[str] = []
    lower: list[FiniteFloat]
    upper: list[FiniteFloat]
    options: dict[str, Any] = {}

    @field_validator("driver")
    @classmethod
    def _driver(cls, value: str) -> str:
        return _known_driver("joints", value)

    @model_validator(mode="after")
    def _consistent(self) -> JointsConfig:
        n = len(self.names)
        if len(set(self.names)) != n:
            raise ValueError(f"names: duplicate joint name in {self.names}")
        for key in ("lower", "upper"):
            got = len(getattr(self, key))
            if got != n:
                raise ValueError(f"{key}: needs one value per joint ({n}), got {got}")
        for i, (lo, hi) in enumerate(zip(self.lower, self.upper)):
            if not lo < hi:
                raise ValueError(
                    f"lower/upper: joint {self.names[i]!r} has lower {lo} >= upper {hi}"
                )
        unknown = [g for g in self.grippers if g not in self.names]
        if unknown:
            raise ValueError(f"grippers: {unknown} are not joint names {self.names}")
        return self

    def gripper_indices(self) -> tuple[int, ...]:
        return tuple(self.names.index(g) for g in self.grippers)


class SafetyConfig(_Model):
    # out of limits by at most this → clipped (0: nothing is clipped, all rejected)
    clip_tolerance: float = Field(0.05, ge=0, allow_inf_nan=False)
    max_velocity: list[SafetyLimit] | None = None  # per joint, units/s; None = no limit
    max_acceleration: list[SafetyLimit] | None = None  # per joint, units/s²
    reject_run: int = Field(5, ge=1)  # this many rejected actions in a row latch FAULT
    estop_category: Literal[0, 1] = 1
    driver_fault_run: int = Field(3, ge=1)  # consecutive failed ticks before the driver is faulted


class CameraConfig(_Model):
    driver: str = "sim"
    width: int = Field(gt=0, le=8192)
    height: int = Field(gt=0, le=8192)
    fps: float = Field(gt=0, le=1000)
    max_age_ms: float = Field(200.0, gt=0)
    ring_seconds: float = Field(2.0, gt=0, le=60)
    options: dict[str, Any] = {}

    @field_validator("driver")
    @classmethod
    def _driver(cls, value: str) -> str:
        return _known_driver("cameras", value)


class OpenpiConfig(OpenpiOptions):
    """[policy.openpi], used with policy.link = "openpi": the request mapping (inputs),
    the action mapping, API key, timeouts and backoff (robotd.link.openpi.options)."""


class PolicyConfig(_Model):
    # robotd: robotd's own link to `robotd serve` (over its byte stream or ZeroMQ, as the
    # endpoint says; "zmq", its name before the stream, is taken for it); openpi: an openpi
    # websocket policy server
    link: Literal["robotd", "openpi"] = "robotd"
    worker: str = ""  # endpoint of a remote worker (ws://host:8000 for openpi); empty = local
    serve: str = "robotd.demo:DotFollower"  # MODULE:CLASS for the local worker
    args: dict[str, Any] = {}
    timeout_s: float = Field(10.0, gt=0)
    # at most the wait an act may ask of the worker (robotd.worker.requests.MAX_WAIT_S)
    stream_wait_s: float = Field(10.0, gt=0, le=600)
    # a chunk's rows, as answered and at the control rate; more is refused whole
    max_chunk_rows: int = Field(1024, ge=1, le=4096)
    # no answer to the worker's heartbeat this long: gone (the robot holds, reconnect)
    heartbeat_s: float = Field(2.0, gt=0, le=60)
    reconnect_max_s: float = Field(5.0, gt=0, le=300)  # the reconnect backoff's cap
    # the local worker (no policy.worker): copies of the policy in child processes (a
    # second is a warm spare, ready at once when one is lost) and when a copy counts as hung
    # (shorter than control.max_hold_steps / hz; unset, capped at half of it: model.py)
    copies: int = Field(2, ge=0, le=16)
    hang_s: float = Field(5.0, gt=0, le=600)
    # uploads one episode may hold on the worker (in flight), lowered to the worker's own
    max_episode_frames: int = Field(1024, ge=1)
    max_episode_bytes: int = Field(64 << 20, ge=1)
    # for servers that cannot declare their contract (openpi): validated by robotd.contract
    observations: dict[str, Any] | None = None
    actions: dict[str, Any] | None = None
    openpi: OpenpiConfig = OpenpiConfig()

    @field_validator("link", mode="before")
    @classmethod
    def _old_link_name(cls, value: Any) -> Any:
        return "robotd" if value == "zmq" else value

    @field_validator("serve")
    @classmethod
    def _serve(cls, value: str, info: ValidationInfo) -> str:
        """What the local worker imports (not checked for a remote worker, which serves
        what it was started with)."""
        local = info.data.get("link") == "robotd" and not info.data.get("worker")
        if local and not POLICY_SPEC.fullmatch(value):
            raise ValueError(
                f"{value!r} is not MODULE:CLASS (the local worker imports MODULE and serves "
                "its CLASS, e.g. 'robotd.demo:DotFollower')"
            )
        return value

    @model_validator(mode="after")
    def _worker_endpoint(self) -> PolicyConfig:
        ep = self.worker
        if self.link != "robotd" or not ep:
            return self
        if is_stream(ep):
            try:
                parse_stream(ep)
            except EndpointError as err:
                raise ValueError(f"worker: {err}") from None
        elif not ep.startswith(("tcp://", "ipc://")):
            openpi = ep.startswith(("ws://", "wss://"))
            hint = ' (ws:// and wss:// are for policy.link = "openpi")' if openpi else ""
            raise ValueError(
                f"worker: {ep!r}: a robotd worker listens on stream+tcp://HOST:PORT, "
                f"stream+ipc://PATH, tcp://HOST:PORT or ipc://PATH{hint}"
            )
        elif port_problem(ep):
            raise ValueError(f"worker: {port_problem(ep)}")
        return self


# The longest socket name robotd makes in the run directory, and the kernel's limit on
# a unix socket path (sun_path, 108 bytes with its NUL).
_LONGEST_SOCKET = "/worker-4194304-o.sock"
_SUN_PATH_MAX = 107


class RuntimeConfig(_Model):
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


