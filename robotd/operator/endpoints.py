"""Where the operator sockets are and how they are secured, known before any is bound.

The control and telemetry endpoints come from the config or default to ipc:// in the run
directory; a tcp endpoint needs usable CURVE keys (robotd.operator.curve). `robotd check`
and `robotd run` ask `check_operator` before anything moves, without building the server
(robotd.operator.server), which asks the same functions as it binds.
"""

from __future__ import annotations

from pathlib import Path

from robotd.config import Config
from robotd.errors import ConfigError
from robotd.operator.curve import KeyFileError, ServerKeys, load_server_keys


def endpoints(cfg: Config, run_dir: Path) -> tuple[str, str]:
    """The control and telemetry endpoints: the config's, else ipc:// in the run directory."""
    control = cfg.runtime.control_endpoint or f"ipc://{run_dir}/control.sock"
    telemetry = cfg.runtime.telemetry_endpoint or f"ipc://{run_dir}/telemetry.sock"
    for ep, key in ((control, "control_endpoint"), (telemetry, "telemetry_endpoint")):
        if not ep.startswith(("ipc://", "tcp://")):
            raise ValueError(f"runtime.{key}: {ep!r}: only ipc:// and tcp:// are served")
    return control, telemetry


def _uses_tcp(cfg: Config) -> bool:
    r = cfg.runtime
    return any(ep.startswith("tcp://") for ep in (r.control_endpoint, r.telemetry_endpoint))


def server_keys(cfg: Config) -> ServerKeys | None:
    """The CURVE keys when an operator endpoint is tcp (KeyFileError when unusable)."""
    if not _uses_tcp(cfg):
        return None
    r = cfg.runtime
    if not (r.curve_secret_key and r.curve_clients):
        raise KeyFileError(
            "a tcp operator endpoint needs runtime.curve_secret_key and curve_clients"
        )
    return load_server_keys(r.curve_secret_key, r.curve_clients)


def check_operator(cfg: Config, where: str = "") -> None:
    """What `robotd check` and `robotd run` ask before anything moves: tcp endpoints have
    usable CURVE keys. Raises ConfigError naming the key and the file."""
    try:
        server_keys(cfg)
    except KeyFileError as exc:
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}runtime.curve_secret_key/curve_clients: {exc}") from None


def ipc_path(ep: str) -> Path | None:
    """The socket file of an ipc:// endpoint (None for tcp): made 0660, removed at the end."""
    return Path(ep.removeprefix("ipc://")) if ep.startswith("ipc://") else None

