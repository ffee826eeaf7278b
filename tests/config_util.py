"""Config files as the config tests write and load them: the sim config's text, a file
holding some text, and the one-line error a load refuses it with."""

from __future__ import annotations

from pathlib import Path

import pytest

from robotd.config import DEFAULT_CONFIG, load_config
from robotd.errors import ConfigError

SIM = DEFAULT_CONFIG.read_text()


def write(tmp_path: Path, text: str, name: str = "x.toml") -> Path:
    """`text` written to `tmp_path`/`name` (the messages tests expect say x.toml); its path."""
    path = tmp_path / name
    path.write_text(text)
    return path


def error(path: Path | None, *overrides: str) -> str:
    """The message of the ConfigError that loading `path` (None: the embedded default) with
    `overrides` (each as --set takes it) raises; the test fails if it loads."""
    with pytest.raises(ConfigError) as err:
        load_config(path, list(overrides))
    return str(err.value)
