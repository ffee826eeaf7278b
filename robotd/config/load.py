"""Reading a robot's config: the file (TOML), `--set` overrides, driver options checked by
each driver's own model, and where a run's directory is.

Every error names the file, the key path and the rule, e.g.
``config/x.toml: control.hz: must be > 0, got -5``. Unknown keys are errors.
"""

from __future__ import annotations

import copy
import importlib.resources
import os
import stat
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from robotd.config.model import Config
from robotd.errors import ConfigError, format_validation_error


def _default_config(repo_file: Path) -> Path:
    """The embedded default config: ``repo_file`` (config/sim.toml of a source checkout,
    what the README and Makefile name) when it exists, else the identical copy shipped as
    package data in robotd/data/sim.toml (a wheel install has no config/ directory)."""
    if repo_file.is_file():
        return repo_file
    # robotd installs as plain files (never zipped), so the resource is a real path
    return Path(str(importlib.resources.files("robotd") / "data" / "sim.toml"))


DEFAULT_CONFIG = _default_config(Path(__file__).resolve().parents[2] / "config" / "sim.toml")

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
