"""Where robotctl finds the daemon: the way the service puts it.

In order: `--endpoint` (or $ROBOTD_ENDPOINT); the endpoints of `--config`; the
service's run directory /run/robotd when it exists (systemd's RuntimeDirectory);
else the user's own (robotd.config.default_run_dir: $XDG_RUNTIME_DIR/robotd or
/tmp/robotd-UID). A tcp endpoint needs CURVE keys: the server's public key
(`--server-key`, $ROBOTD_SERVER_KEY) and the client's own pair (`--key`,
$ROBOTCTL_KEY, default ~/.config/robotd/robotctl.key_secret).

From `--config` only the keys that say where the daemon is are read (LOCATING:
runtime.dir, runtime.control_endpoint, runtime.telemetry_endpoint), each checked on its
own, so that a config with a mistake elsewhere (a typo'd safety key, a missing joints
table) still finds the daemon: an e-stop must always be tried. How a bad locating key is
taken depends on the caller: `lenient` (the e-stop) ignores it with a warning naming it
and looks where the daemon would be without it; otherwise it is a ConfigError, for
`start` sent to some other daemon than the one the config names is worse than no start.
"""

from __future__ import annotations

import contextlib
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from robotd.config import SERVICE_RUN_DIR, default_run_dir
from robotd.errors import ConfigError
from robotd.operator.client import CurveClient
from robotd.operator.curve import KeyFileError, load_client_keys, load_public_key

LOCATING = ("dir", "control_endpoint", "telemetry_endpoint")  # of [runtime]
Warn = Callable[[str], None]


class LocateError(ValueError):
    """The endpoint or the keys given cannot be used; the message says which and why."""


@dataclass(frozen=True)
class Target:
    """Where the daemon is. `lane`: an ipc endpoint in the daemon's run directory, whose
    lane.sock the e-stop falls back on (None when unknown: a tcp --endpoint)."""

    control: str
    telemetry: str
    curve: CurveClient | None = None
    lane: str | None = None

    @property
    def lane_control(self) -> str:
        """The endpoint beside the lane's socket (estop_via_lane's argument)."""
        return self.lane or self.control


def default_key_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "robotd" / "robotctl.key_secret"


def endpoint_problem(endpoint: str) -> str | None:
    """Why `endpoint` cannot be a daemon's socket (no ipc:// or tcp://, an ipc endpoint
    without a socket path, a tcp one without a numeric port), or None when it can."""
    if endpoint.startswith("ipc://"):
        if not Path(endpoint.removeprefix("ipc://")).name:
            return "the endpoint has no socket path (e.g. ipc:///run/robotd/control.sock)"
        return None
    if not endpoint.startswith("tcp://"):
        return "use ipc://PATH or tcp://HOST:PORT"
    try:
        port = urlsplit(endpoint).port  # ValueError when not a number 0-65535
    except ValueError:
        return "the port is not a number 0-65535"
    return None if port is not None else "a tcp endpoint needs a port"


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


def _key_problem(key: str, value: Any) -> str | None:
    """Why the locating key runtime.`key` cannot be used as `value`, or None."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if key != "dir":
        return endpoint_problem(value) if value else None
    from pydantic import ValidationError

    from robotd.config.sections import RuntimeConfig

    try:  # the daemon's own rule for its run directory (its socket paths must fit)
        RuntimeConfig.model_validate({"dir": value}, strict=True)
    except ValidationError as exc:
        return "; ".join(str(e.get("msg", "invalid")).removeprefix("Value error, ")
                         for e in exc.errors())  # fmt: skip
    return None


def _read_runtime(path: Path) -> tuple[dict[str, Any], str]:
    """The file's [runtime] table (only its locating keys) and its text; ConfigError
    when the file cannot be read or is no TOML at all."""
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
        raw = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    runtime = raw.get("runtime", {})
    if not isinstance(runtime, dict):
        raise ConfigError(f"{where}: runtime: must be a table")
    return {k: runtime[k] for k in LOCATING if k in runtime}, text


def _from_config(path: Path, lenient: bool, warn: Warn) -> tuple[str, str, Path]:
    """(control, telemetry, run directory) as the daemon of `path` serves them."""
    from robotd.config.lines import key_lines, line_of

    fallback = "robotctl looks where the daemon would be without it"
    try:
        given, text = _read_runtime(path)
    except ConfigError as exc:
        if not lenient:
            raise
        warn(f"{exc}: ignored, {fallback}")
        given, text = {}, ""
    lines, problems = key_lines(text), []
    for key in list(given):
        why = _key_problem(key, given[key])
        if why is not None:
            n = line_of(f"runtime.{key}", lines)
            problems.append(f"{path}{f':{n}' if n else ''}: runtime.{key}: {why}")
            del given[key]
    if problems and not lenient:
        raise ConfigError("\n".join(problems))
    for problem in problems:
        warn(f"{problem}: ignored, {fallback}")
    run_dir = Path(given["dir"]) if given.get("dir") else _run_dir()
    control = given.get("control_endpoint") or f"ipc://{run_dir}/control.sock"
    telemetry = given.get("telemetry_endpoint") or f"ipc://{run_dir}/telemetry.sock"
    return control, telemetry, run_dir


def config_problems(path: Path) -> str | None:
    """What the full check of the config says is wrong with it (robotd check's words),
    or None: for robotctl to mention, since the daemon may run another version of it."""
    from robotd.config import load_config

    try:
        load_config(path)
    except ConfigError as exc:
        return str(exc)
    return None


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
    *,
    lenient: bool = False,
    warn: Warn = lambda _: None,
) -> Target:
    """The daemon's endpoints (and keys for tcp); LocateError, ConfigError or KeyFileError
    when unusable. `lenient` (the e-stop): a config's bad locating keys, and a tcp
    endpoint's missing keys when the run directory (so lane.sock) is known, are `warn`ed
    about and passed over instead."""
    endpoint = endpoint or os.environ.get("ROBOTD_ENDPOINT") or None
    run_dir: Path | None = None
    if endpoint:
        if not endpoint.startswith(("ipc://", "tcp://")):
            raise LocateError(f"--endpoint {endpoint!r}: use ipc://PATH or tcp://HOST:PORT")
        control, tele = endpoint, telemetry or _beside(endpoint)
    elif config is not None:
        control, tele, run_dir = _from_config(config, lenient, warn)
        tele = telemetry or tele
    else:
        run_dir = _run_dir()
        control = f"ipc://{run_dir}/control.sock"
        tele = telemetry or f"ipc://{run_dir}/telemetry.sock"
    lane = control if control.startswith("ipc://") else None
    if lane is None and run_dir is not None:
        lane = f"ipc://{run_dir}/control.sock"
    if not (control.startswith("tcp://") or tele.startswith("tcp://")):
        return Target(control, tele, None, lane)
    try:
        return Target(control, tele, _curve(server_key, key), lane)
    except (LocateError, KeyFileError) as exc:
        if not (lenient and lane is not None):
            raise
        warn(f"{exc}: the daemon at {control} cannot be asked; only its lane.sock is tried")
        return Target(control, tele, None, lane)


def locate_for(
    command: str,
    endpoint: str | None,
    telemetry: str | None,
    config: Path | None,
    server_key: str | None,
    key: str | None,
    *,
    warn: Warn,
) -> Target:
    """The daemon for robotctl's `command`: for estop leniently (a config's bad locating
    key is a warning: the e-stop is always tried), for the rest strictly, and what else
    is wrong with `config` is `warn`ed about (the daemon it locates is still asked)."""
    lenient = command == "estop"
    target = locate(endpoint, telemetry, config, server_key, key, lenient=lenient, warn=warn)
    by_config = not (endpoint or os.environ.get("ROBOTD_ENDPOINT"))  # else it was not read
    if config is not None and by_config and not lenient and (problems := config_problems(config)):
        warn(
            "the config has problems; the daemon was found from its runtime.dir and "
            f"endpoints alone, and is asked anyway:\n{problems}"
        )
    return target


class Handshake:
    """Whether the daemon's operator socket completes a ZeroMQ handshake with this client:
    proof that its main process is up (its I/O thread answered; over tcp, it took this
    client's CURVE keys) even when no reply comes, as when the control lane it waits on
    is stopped. Connect it before the request it vouches for, so that checking costs no
    extra wait; close() it after. Never raises: a probe that cannot start says False."""

    def __init__(self, target: Target) -> None:
        import zmq

        from robotd.operator.curve import set_curve_client

        self.sock: Any = None
        self.monitor: Any = None
        try:
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            self.sock = sock
            if target.curve is not None:
                c = target.curve
                set_curve_client(sock, c.server_public, c.public, c.secret)
            self.monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            sock.connect(target.control)
        except zmq.ZMQError:
            self.close()

    def seen(self, wait_s: float = 0.05) -> bool:
        """True once the handshake succeeded (waiting at most `wait_s` for the event)."""
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        if self.monitor is None:
            return False
        try:
            while self.monitor.poll(int(wait_s * 1000)):
                if recv_monitor_message(self.monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    return True
        except zmq.ZMQError:
            pass
        return False

    def close(self) -> None:
        import zmq

        if self.sock is not None and self.monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.sock.disable_monitor()
        for sock in (self.monitor, self.sock):
            if sock is not None:
                sock.close(linger=0)
        self.monitor = self.sock = None
