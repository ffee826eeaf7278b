"""One TOML file per robot, validated into typed models.

Every error names the file, the key path and the rule, e.g.
``config/x.toml: control.hz: must be > 0, got -5``. Unknown keys are errors.
Driver options are validated by the driver's own ``Options`` model, so a typo in
``[joints.options]`` is caught at start-up and not at the first tick.
"""

from __future__ import annotations

import copy
import importlib.resources
import os
import stat
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from robotd.errors import ConfigError, format_validation_error
from robotd.link.openpi.options import OpenpiOptions
from robotd.trace.options import TraceOptions


def _default_config(repo_file: Path) -> Path:
    """The embedded default config: ``repo_file`` (config/sim.toml of a source checkout,
    what the README and Makefile name) when it exists, else the identical copy shipped as
    package data in robotd/data/sim.toml (a wheel install has no config/ directory)."""
    if repo_file.is_file():
        return repo_file
    # robotd installs as plain files (never zipped), so the resource is a real path
    return Path(str(importlib.resources.files("robotd") / "data" / "sim.toml"))


DEFAULT_CONFIG = _default_config(Path(__file__).resolve().parent.parent / "config" / "sim.toml")

PositiveFloat = Annotated[float, Field(gt=0)]
# A safety limit: NaN would make every comparison false (and the shield's clamp emit NaN),
# inf no limit at all, zero or less a robot that cannot move.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
SafetyLimit = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RobotConfig(_Model):
    name: str = "robot"
    # latched: FAULT with the e-stop latched (every real robot); idle: no motion until
    # `start`; episode: the first episode starts by itself (simulated robots only).
    start: Literal["latched", "idle", "episode"] = "latched"


class ControlConfig(_Model):
    hz: float = Field(30.0, gt=0, le=2000)
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


class OpenpiConfig(OpenpiOptions):
    """[policy.openpi], used with policy.link = "openpi": the request mapping (inputs),
    the action mapping, API key, timeouts and backoff (robotd.link.openpi.options)."""


class PolicyConfig(_Model):
    # zmq: robotd's own link to `robotd serve`; openpi: an openpi websocket policy server
    link: Literal["zmq", "openpi"] = "zmq"
    worker: str = ""  # endpoint of a remote worker (ws://host:8000 for openpi); empty = local
    serve: str = "robotd.demo:DotFollower"  # MODULE:CLASS for the local worker
    args: dict[str, Any] = {}
    timeout_s: float = Field(10.0, gt=0)
    stream_wait_s: float = Field(10.0, gt=0)
    # a chunk's rows, as answered and at the control rate; more is refused whole
    max_chunk_rows: int = Field(1024, ge=1, le=4096)
    # no answer to the worker's heartbeat this long: gone (the robot holds, reconnect)
    heartbeat_s: float = Field(2.0, gt=0, le=60)
    reconnect_max_s: float = Field(5.0, gt=0, le=300)  # the reconnect backoff's cap
    # the local worker (no policy.worker): copies of the policy in child processes (a
    # second is a warm spare, ready at once when one is lost) and when a copy counts as hung
    copies: int = Field(2, ge=0, le=16)
    hang_s: float = Field(5.0, gt=0, le=600)
    # uploads one episode may hold on the worker (SPEC §4), lowered to the worker's own
    max_episode_frames: int = Field(1024, ge=1)
    max_episode_bytes: int = Field(64 << 20, ge=1)
    # for servers that cannot declare their contract (openpi): validated by robotd.contract
    observations: dict[str, Any] | None = None
    actions: dict[str, Any] | None = None
    openpi: OpenpiConfig = OpenpiConfig()


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


class Config(_Model):
    robot: RobotConfig = RobotConfig()
    control: ControlConfig = ControlConfig()
    joints: JointsConfig
    safety: SafetyConfig = SafetyConfig()
    cameras: dict[str, CameraConfig] = {}
    policy: PolicyConfig = PolicyConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    trace: TraceOptions = TraceOptions()

    @model_validator(mode="after")
    def _cross(self) -> Config:
        c = self.control
        if c.merge != "replace" and (c.timing == "sync" or not c.aligned):
            why = "sync timing" if c.timing == "sync" else "aligned = false"
            raise ValueError(
                f"control.merge: {c.merge!r} blends chunks in realtime aligned timing only, "
                f"not with {why}; use merge = 'replace'"
            )
        n = len(self.joints.names)
        for key in ("max_velocity", "max_acceleration"):
            vals = getattr(self.safety, key)
            if vals is not None and len(vals) != n:
                raise ValueError(f"safety.{key}: needs one value per joint ({n}), got {len(vals)}")
            if vals is not None and any(v <= 0 for v in vals):
                raise ValueError(f"safety.{key}: every value must be > 0, got {vals}")
        self._check_contract()
        if self.policy.link == "openpi":
            streams = (self.policy.observations or {}).get("streams")
            self.policy.openpi.check(self.policy.worker, list(self.cameras), n, streams)
        clash = set(self.cameras) & {"joints.pos", "joints.vel"}
        for name in self.cameras:
            if not name or not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(
                    f"cameras.{name!r}: a camera name must be alphanumeric (- and _ allowed)"
                )
        if clash:
            raise ValueError(f"cameras: names {sorted(clash)} clash with joint observation keys")
        if self.robot.start == "episode" and (
            self.joints.driver != "sim" or any(c.driver != "sim" for c in self.cameras.values())
        ):
            raise ValueError(
                "robot.start: 'episode' (start moving by itself) is allowed for simulated "
                "robots only; a real robot starts 'latched'"
            )
        return self

    def _check_contract(self) -> None:
        """A contract declared here (for servers that cannot) is checked at load, not at run."""
        from robotd.contract import Actions, ContractError, Observations

        p = self.policy
        try:
            if p.observations is not None:
                obs = Observations.from_wire(p.observations, "policy.observations")
                obs.resolve(self.control.hz)
                unknown = sorted(set(obs.streams) - set(self.observation_keys))
                if unknown:
                    raise ValueError(
                        f"policy.observations.streams: {unknown} are not observation keys of "
                        f"this robot {self.observation_keys}"
                    )
            if p.actions is not None:
                Actions.from_wire(p.actions, "policy.actions")
        except ContractError as exc:
            raise ValueError(str(exc)) from None

    @property
    def observation_keys(self) -> list[str]:
        """Every key a step's observation can hold: each camera, then the joint streams."""
        return [*self.cameras, "joints.pos", "joints.vel"]


def _parse_value(text: str) -> Any:
    """A --set value in TOML syntax; a bare word that is not TOML is taken as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply_override(raw: dict[str, Any], assignment: str) -> str:
    """Set one dotted key from KEY=VALUE; returns the key."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE (e.g. control.hz=100)")
    key, _, text = assignment.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {assignment!r}: empty part in key path {key!r}")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"--set {key}: {where} is a value, not a table")
        node = child
    node[parts[-1]] = _parse_value(text.strip())
    return ".".join(parts)


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()
) -> Config:
    """Read, override and validate a robot config; ConfigError names file, key path and rule."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    where = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{where}: not UTF-8 text (byte {exc.start}): a TOML file is UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    return config_from_dict(raw, where=where, overrides=overrides)


def config_from_dict(
    raw: dict[str, Any], *, where: str = "<config>", overrides: Iterable[str] = ()
) -> Config:
    raw = copy.deepcopy(raw)
    overridden = set()
    for assignment in overrides:
        overridden.add(_apply_override(raw, assignment))
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(
            format_validation_error(exc, where, overridden=frozenset(overridden))
        ) from None
    _check_driver_options(cfg, where)
    return cfg


def _check_driver_options(cfg: Config, where: str) -> None:
    """Each driver's options validated by the driver's own Options model, at load."""
    from drivers.base import DriverConfigError, driver_class, validate_options

    checks = [("joints", cfg.joints.driver, cfg.joints.options, "joints")]
    checks += [("cameras", c.driver, c.options, f"cameras.{n}") for n, c in cfg.cameras.items()]
    for kind, driver, options, key in checks:
        try:
            cls = driver_class(kind, driver)
        except DriverConfigError as exc:
            raise ConfigError(f"{where}: {key}.driver: {exc}") from None
        try:
            validate_options(cls, options)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, where, f"{key}.options")) from None


def runtime_dir(cfg: Config) -> Path:
    """Where sockets, the trace and the summary live for this run."""
    if cfg.runtime.dir:
        return Path(cfg.runtime.dir)
    return default_run_dir()


SERVICE_RUN_DIR = Path("/run/robotd")  # systemd's RuntimeDirectory=robotd


def default_run_dir() -> Path:
    """The run directory when the config names none: systemd's RuntimeDirectory when the
    service runs, else the user's runtime directory ($XDG_RUNTIME_DIR/robotd), else
    /tmp/robotd-<uid>."""
    env = os.environ.get("RUNTIME_DIRECTORY")
    if env:
        return Path(env.split(":")[0])
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        try:
            st = os.stat(xdg)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            return Path(xdg) / "robotd"
    return Path(f"/tmp/robotd-{os.geteuid()}")
