"""One TOML file per robot, validated into typed models (sections.py, policy.py, model.py)
and read with its overrides (load.py). Driver options are validated by the driver's own
`Options` model, so a typo in `[joints.options]` is caught at start-up and not at the
first tick."""

from robotd.config.load import (
    DEFAULT_CONFIG,
    SERVICE_RUN_DIR,
    Loaded,
    _default_config,
    _parse_value,
    config_from_dict,
    default_run_dir,
    load,
    load_config,
    loaded_from_dict,
    runtime_dir,
)
from robotd.config.model import Config
from robotd.config.policy import OpenpiConfig, PolicyConfig
from robotd.config.sections import (
    CameraConfig,
    ControlConfig,
    JointsConfig,
    RobotConfig,
    RuntimeConfig,
    SafetyConfig,
)

__all__ = [
    "DEFAULT_CONFIG",
    "SERVICE_RUN_DIR",
    "CameraConfig",
    "Config",
    "ControlConfig",
    "JointsConfig",
    "Loaded",
    "OpenpiConfig",
    "PolicyConfig",
    "RobotConfig",
    "RuntimeConfig",
    "SafetyConfig",
    "_default_config",
    "_parse_value",
    "config_from_dict",
    "default_run_dir",
    "load",
    "load_config",
    "loaded_from_dict",
    "runtime_dir",
]
