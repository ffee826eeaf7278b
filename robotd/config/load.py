"""Reading a robot's config: the file (TOML), `--set` overrides, driver options checked by
each driver's own model, and where a run's directory is.

Every error names the file and its line (or the --set that gave the value), the key path
and the rule, e.g. ``config/x.toml:12: control.hz: must be > 0, got -5``, and every one
found is reported at once. Unknown keys are errors, and values are not converted from another kind
(strict: a TOML bool is no number, a string no bool).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.resources
import math
import os
import stat
import tomllib
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from robotd.config.lines import key_lines, line_of, with_lines
from robotd.config.model import Config
from robotd.config.overrides import (
    TOO_DEEP,
    Origins,
    apply_override,
    blame,
    blame_keys,
    error_lines,
    non_finite,
    set_source,
    too_deep,
)
from robotd.config.overrides import parse_value as _parse_value  # noqa: F401 (re-exported)
from robotd.config.sections import CameraConfig, JointsConfig
from robotd.config.strict import validate_strictly
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


@dataclass(frozen=True)
class Loaded:
    """A loaded config and what its load knew: where it came from (`where`, the file as
    errors name it; `origins`, what each --set gave or made) and each camera's options as
    its driver's model validated them (by camera name), and the joint driver's, for the
    checks made after load (`robotd check`) to name a key and check options as the load
    did, not again."""

    config: Config
    where: str
    origins: Origins
    camera_options: Mapping[str, BaseModel]
    joint_options: BaseModel | None = None
    text: str = ""  # the file's text, to place a key at its line ("": none to place)

    def blame(self, key: str) -> str:
        """How an error names `key`: the --set that gave it (or made its table), else the
        file and the key's line (`overrides.blame`, the rule load's own errors follow)."""
        said = blame(self.where, key, self.origins)
        if not self.text or set_source(key, self.origins) is not None:
            return said
        n = line_of(key, self._lines)
        return said if n is None else f"{self.where}:{n}: {key}"

    def blame_keys(self, keys: Sequence[str]) -> str:
        """How an error about several keys names them (`overrides.blame_keys`), the first
        placed at its line when the file gave it."""
        said = blame_keys(self.where, keys, self.origins)
        return self.blame(keys[0]) if said == blame(self.where, keys[0], self.origins) else said

    @functools.cached_property
    def _lines(self) -> dict[str, int]:
        return key_lines(self.text)


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()
) -> Config:
    """Read, override and validate a robot config; ConfigError names file, key path and rule."""
    return load(path, overrides).config


def load(path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()) -> Loaded:
    """`load_config`, with what the load knew (`Loaded`)."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    where = str(path)
    try:
        # utf-8-sig: a leading byte-order mark (what editors on Windows write) is not text
        text = path.read_text(encoding="utf-8-sig")
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
    except RecursionError:  # the parser recurses once per nested array or inline table
        raise ConfigError(f"{where}: not valid TOML: {TOO_DEEP}") from None
    try:
        loaded = loaded_from_dict(raw, where=where, overrides=overrides)
    except ConfigError as exc:
        raise ConfigError(with_lines(str(exc), where, text)) from None
    return dataclasses.replace(loaded, text=text)


def config_from_dict(
    raw: dict[str, Any], *, where: str = "<config>", overrides: Iterable[str] = ()
) -> Config:
    """`raw` (a parsed TOML file) with its overrides applied, validated: ConfigError with
    one line per problem, every one found (the driver options against the joints and the
    tick timing are checked once the config itself is valid)."""
    return loaded_from_dict(raw, where=where, overrides=overrides).config


def loaded_from_dict(
    raw: dict[str, Any], *, where: str = "<config>", overrides: Iterable[str] = ()
) -> Loaded:
    """`config_from_dict`, with what the load knew (`Loaded`)."""
    origins: Origins = {}
    deep = too_deep(raw)
    if deep is not None:
        raise ConfigError(f"{blame(where, deep, origins)}: {TOO_DEEP}")
    raw = copy.deepcopy(raw)
    for assignment in overrides:
        key = apply_override(raw, assignment, origins)
        deep = too_deep(raw)
        if deep is not None:
            raise ConfigError(f"--set {key}: {deep}: {TOO_DEEP}")
    skip, problems = non_finite(raw, where, origins)
    cfg = None
    try:
        # strict: a TOML bool is no number and a string no bool (an int is taken for a float)
        cfg = Config.model_validate(raw, strict=True)
    except ValidationError as exc:
        problems += error_lines(exc.errors(), where, origins, skip=skip)
    options, found = _check_driver_options(raw, cfg, where, origins, skip)
    problems += found
    if problems or cfg is None:
        raise ConfigError("\n".join(problems))
    cfg = _check_tick_timing(cfg, options.get("joints"), where, origins)
    cameras = {k.removeprefix("cameras."): v for k, v in options.items() if k != "joints"}
    return Loaded(cfg, where, origins, cameras, options.get("joints"))


def _driver_tables(raw: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any], str]]:
    """(kind, driver name, options, key) of each driver's table in `raw` well formed enough
    to check its options (what is not is reported by the config's own model)."""
    tables = [("joints", raw.get("joints"), "joints", JointsConfig)]
    cameras = raw.get("cameras")
    if isinstance(cameras, dict):
        tables += [("cameras", t, f"cameras.{n}", CameraConfig) for n, t in cameras.items()]
    for kind, table, key, model in tables:
        if not isinstance(table, dict):
            continue
        driver = table.get("driver", model.model_fields["driver"].default)
        options = table.get("options", {})
        if isinstance(driver, str) and isinstance(options, dict):
            yield kind, driver, options, key


def _check_driver_options(
    raw: dict[str, Any], cfg: Config | None, where: str, origins: Origins, skip: Collection[str]
) -> tuple[dict[str, BaseModel], list[str]]:
    """Each driver's options validated by the driver's own Options model, at load (even
    when the rest of the config is not valid), and the joint driver's against the joints
    (`check_joint_options`, with a valid `cfg`): (each driver's validated options by its
    table's key, "joints" or "cameras.NAME", for the checks against the config and after
    load; a line per problem)."""
    from drivers.base import DriverConfigError, check_joint_options, driver_class

    validated_options: dict[str, BaseModel] = {}
    problems: list[str] = []
    for kind, driver, options, key in _driver_tables(raw):
        try:
            cls = driver_class(kind, driver)
        except DriverConfigError:
            continue  # reported with its section (joints.driver, cameras.NAME.driver)
        validated, errors = validate_strictly(cls.Options, options)
        problems += error_lines(errors, where, origins, f"{key}.options", skip)
        if validated is not None:
            validated_options[key] = validated
        if kind == "joints" and validated is not None and cfg is not None:
            try:
                check_joint_options(cls, cfg.joints.names, validated)
            except ValueError as exc:
                # every such rule is about the joints: a --set of joints.names is to blame
                at, why = _option_key(str(exc), validated)
                problems.append(f"{blame_keys(where, [at, 'joints.names'], origins)}: {why}")
    return validated_options, problems


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
    problems = []
    if watchdog and watchdog < floor:
        problems.append(
            f"{blame_keys(where, ['joints.options.watchdog_ms', 'control.hz'], origins)}: "
            f"{watchdog:g} ms is shorter than {WATCHDOG_MIN_PERIODS} control tick periods "
            f"({floor:.1f} ms; the period is {period_ms:.1f} ms at {at}): the servos would "
            f"stop between ticks; make it at least {math.ceil(floor)} ms, or 0 (off)"
        )
    if budget is not None and budget > period_ms:
        problems.append(
            f"{blame_keys(where, ['joints.options.budget_ms', 'control.hz'], origins)}: "
            f"{budget:g} ms is longer than the control tick period ({period_ms:.1f} ms at "
            f"{at}): a tick's read cannot take longer than the tick; make it at most "
            f"{math.floor(period_ms * 10) / 10:g} ms (less leaves the tick time to write)"
        )
    if problems:
        raise ConfigError("\n".join(problems))
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
