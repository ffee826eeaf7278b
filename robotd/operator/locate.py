"""Where robotctl finds the daemon: the way the service puts it.

In order: `--endpoint` (or $ROBOTD_ENDPOINT); the endpoints of `--config`; the
service's run directory /run/robotd when it exists (systemd's RuntimeDirectory);
else the user's own (robotd.config.default_run_dir: $XDG_RUNTIME_DIR/robotd or
/tmp/robotd-UID). A tcp endpoint needs CURVE keys: the server's public key
(`--server-key`, $ROBOTD_SERVER_KEY) and the client's own pair (`--key`,
$ROBOTCTL_KEY, default ~/.config/robotd/robotctl.key_secret).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from robotd.config import SERVICE_RUN_DIR, default_run_dir
from robotd.operator.client import CurveClient
from robotd.operator.curve import KeyFileError, load_client_keys, load_public_key


class LocateError(ValueError):
    """The endpoint or the keys given cannot be used; the message says which and why."""


@dataclass(frozen=True)
class Target:
    control: str
    telemetry: str
    curve: CurveClient | None = None


def default_key_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "robotd" / "robotctl.key_secret"


def _beside(control: str) -> str:
    """The telemetry endpoint beside a control endpoint: telemetry.sock in the same
    directory, or the next tcp port."""
    if control.startswith("ipc://"):
        return "ipc://" + str(Path(control.removeprefix("ipc://")).with_name("telemetry.sock"))
    parts = urlsplit(control)
    if parts.port is None:
        raise LocateError(f"--endpoint {control!r}: a tcp endpoint needs a port")
    return f"tcp://{parts.hostname}:{parts.port + 1}"


def _run_dir() -> Path:
    return SERVICE_RUN_DIR if SERVICE_RUN_DIR.is_dir() else default_run_dir()


def _from_config(path: Path) -> tuple[str, str]:
    from robotd.config import load_config
    from robotd.operator.server import endpoints

    cfg = load_config(path)  # ConfigError names what is wrong
    run_dir = Path(cfg.runtime.dir) if cfg.runtime.dir else _run_dir()
    return endpoints(cfg, run_dir)


def _curve(server_key: str | None, key: str | None) -> CurveClient:
    server_key = server_key or os.environ.get("ROBOTD_SERVER_KEY")
    if not server_key:
        raise LocateError(
            "a tcp endpoint is CURVE: give the daemon's public key with --server-key FILE "
            "(or $ROBOTD_SERVER_KEY)"
        )
    own = Path(key or os.environ.get("ROBOTCTL_KEY") or default_key_file())
    try:
        server_public = load_public_key(server_key)
        public, secret = load_client_keys(own)
    except KeyFileError as exc:
        hint = " (make a key pair with: robotctl keygen)" if not own.exists() else ""
        raise KeyFileError(f"{exc}{hint}") from None
    return CurveClient(server_public, public, secret)


def locate(
    endpoint: str | None = None,
    telemetry: str | None = None,
    config: Path | None = None,
    server_key: str | None = None,
    key: str | None = None,
) -> Target:
    """The daemon's endpoints (and keys for tcp); LocateError, ConfigError or KeyFileError
    when unusable."""
    endpoint = endpoint or os.environ.get("ROBOTD_ENDPOINT") or None
    if endpoint:
        if not endpoint.startswith(("ipc://", "tcp://")):
            raise LocateError(f"--endpoint {endpoint!r}: use ipc://PATH or tcp://HOST:PORT")
        control, tele = endpoint, telemetry or _beside(endpoint)
    elif config is not None:
        control, tele = _from_config(config)
        tele = telemetry or tele
    else:
        run_dir = _run_dir()
        control = f"ipc://{run_dir}/control.sock"
        tele = telemetry or f"ipc://{run_dir}/telemetry.sock"
    tcp = control.startswith("tcp://") or tele.startswith("tcp://")
    return Target(control, tele, _curve(server_key, key) if tcp else None)
