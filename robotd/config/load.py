"""Reading a robot's config: the file (TOML), `--set` overrides, driver options checked by
each driver's own model, and where a run's directory is.

Every error names the file, the key path and the rule, e.g.
``config/x.toml: control.hz: must be > 0, got -5``. Unknown keys are errors.
"""

from __future__ import annotations

import copy
import importlib.resources
import math
import os
import stat
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from robotd.config.model import Config
from robotd.config.overrides import Origins, apply_override, blame, check_finite, error_lines
from robotd.config.overrides import parse_value as _parse_value  # noqa: F401 (re-exported)
from robotd.errors import ConfigError


def _default_config(repo_file: Path) -> Path:
    """The embedded default config: ``repo_file`` (config/sim.toml of a source checkout,
    what the README and Makefile name) when it exists, else the identical copy shipped as
    package data in robotd/data/sim.toml (a wheel install has no config/ directory)."""
    if repo_file.is_file():
        return repo_file
    # robotd installs as plain files (never zipped), so the resource is a real path
    return Path(str(importlib.resources.files("robotd") / "data" / "sim.toml"))


DEFAULT_CONFIG = _default_config(Path(__file__).resolve().parents[2] / "config" / "sim.toml")


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
    origins: Origins = {}
    for assignment in overrides:
        apply_override(raw, assignment, origins)
    check_finite(raw, where, origins)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(error_lines(exc, where, origins)) from None
    joint_options = _check_driver_options(cfg, where, origins)
    return _check_tick_timing(cfg, joint_options, where, origins)


def _check_driver_options(cfg: Config, where: str, origins: Origins) -> BaseModel | None:
    """Each driver's options validated by the driver's own Options model, at load, and the
    joint driver's against the joints (`check_joint_options`); the joint driver's
    validated options are returned (for the checks against the config)."""
    from drivers.base import check_joint_options, driver_class, validate_options

    checks = [("joints", cfg.joints.driver, cfg.joints.options, "joints")]
    checks += [("cameras", c.driver, c.options, f"cameras.{n}") for n, c in cfg.cameras.items()]
    joint_options = None
    for kind, driver, options, key in checks:
        cls = driver_class(kind, driver)  # the name was checked with its section
        try:
            validated = validate_options(cls, options)
        except ValidationError as exc:
            raise ConfigError(error_lines(exc, where, origins, f"{key}.options")) from None
        if kind == "joints":
            joint_options = validated
            try:
                check_joint_options(cls, cfg.joints.names, validated)
            except ValueError as exc:
                at, why = _option_key(str(exc), validated)
                raise ConfigError(f"{blame(where, at, origins)}: {why}") from None
    return joint_options


def _option_key(text: str, options: BaseModel) -> tuple[str, str]:
    """A driver's "OPTION: why" as (joints.options.OPTION, why); "names: why" is about
    joints.names; anything else is about the joints."""
    option, sep, rest = text.partition(": ")
    if sep and option in type(options).model_fields:
        return f"joints.options.{option}", rest
    if sep and option == "names":
        return "joints.names", rest
    return "joints", text


# A servo watchdog must outlast the gap between two ticks' writes with room for one late
# tick (an overrun, a slow read): under two periods it would stop the servos every tick.
WATCHDOG_MIN_PERIODS = 2
WATCHDOG_UNIT_MS = 20  # the Bus Watchdog's step
BUDGET_SHARE = 0.8  # a fitted read budget: this share of the period (the rest: the write)


def _check_tick_timing(
    cfg: Config, options: BaseModel | None, where: str, origins: Origins
) -> Config:
    """A joint driver's timing options against the control tick period (1 / control.hz),
    for drivers that have them (the serial servos): `watchdog_ms` (0 = off) at least
    WATCHDOG_MIN_PERIODS periods, `budget_ms` (a tick's read, every try) at most one. A
    default that does not fit the rate is fitted to it (the config returned says so in
    joints.options); a value the config gives is ConfigError naming the key, its value
    and the period."""
    period_ms = 1e3 / cfg.control.hz
    at = f"control.hz = {cfg.control.hz:g}"
    floor = WATCHDOG_MIN_PERIODS * period_ms
    given = cfg.joints.options
    watchdog = getattr(options, "watchdog_ms", None)
    budget = getattr(options, "budget_ms", None)
    fitted: dict[str, Any] = {}
    if watchdog and watchdog < floor and "watchdog_ms" not in given:
        units = math.ceil(1.25 * floor / WATCHDOG_UNIT_MS)
        fitted["watchdog_ms"] = watchdog = min(2540, units * WATCHDOG_UNIT_MS)
    if budget is not None and budget > period_ms and "budget_ms" not in given:
        fitted["budget_ms"] = budget = round(BUDGET_SHARE * period_ms, 2)
    if watchdog and watchdog < floor:
        raise ConfigError(
            f"{blame(where, 'joints.options.watchdog_ms', origins)}: {watchdog:g} ms is "
            f"shorter than {WATCHDOG_MIN_PERIODS} control tick periods ({floor:.1f} ms; the "
            f"period is {period_ms:.1f} ms at {at}): the servos would stop between ticks; "
            f"make it at least {math.ceil(floor)} ms, or 0 (off)"
        )
    if budget is not None and budget > period_ms:
        raise ConfigError(
            f"{blame(where, 'joints.options.budget_ms', origins)}: {budget:g} ms is longer "
            f"than the control tick period ({period_ms:.1f} ms at {at}): a tick's read cannot "
            f"take longer than the tick; make it at most {math.floor(period_ms * 10) / 10:g} ms "
            "(less leaves the tick time to write)"
        )
    if not fitted:
        return cfg
    joints = cfg.joints.model_copy(update={"options": {**given, **fitted}})
    return cfg.model_copy(update={"joints": joints})


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
