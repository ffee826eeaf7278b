"""CURVE for the operator sockets over tcp: the server's key pair, the authorised clients.

Over tcp the control socket and the telemetry PUB are CURVE servers. The daemon's key
pair is one zmq.auth secret-key file (`runtime.curve_secret_key`); the clients it
answers are the public-key files (`*.key`) in `runtime.curve_clients`, read again at
each new connection, so a key added or removed counts from the next connection on.
A client whose key is not there gets no answer at all (ZeroMQ's ZAP handler refuses
the handshake) and is logged once. `robotctl keygen` makes the files.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

log = logging.getLogger("robotd.operator")

ZAP_DOMAIN = "robotd"
KINDS = ("client", "server")  # whose key pair: robotctl's, or the daemon's
_SERVER_NAME = re.compile(r"(^|[-_.])server([-_.]|\d|$)", re.IGNORECASE)
MAX_LOGGED_KEYS = 1000  # unknown keys remembered for "logged once"


class KeyFileError(ValueError):
    """A key file that cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes
    clients_dir: Path


def _read_cert(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        st = path.stat()
    except OSError as exc:
        raise KeyFileError(f"{path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"{path}: not a file")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError, KeyError) as exc:
        raise KeyFileError(f"{path}: not a ZeroMQ certificate ({exc})") from None
    if secret and not secret_key:
        raise KeyFileError(f"{path}: holds no secret key (the .key_secret file is needed)")
    if secret and stat.S_IMODE(st.st_mode) & 0o007:
        raise KeyFileError(f"{path}: a secret key readable by others (chmod 0640 {path})")
    return public, secret_key


def load_server_keys(secret_file: str | Path, clients_dir: str | Path) -> ServerKeys:
    """The daemon's key pair and its authorised-clients directory; KeyFileError says why not."""
    public, secret = _read_cert(Path(secret_file), secret=True)
    clients = Path(clients_dir)
    if not clients.is_dir():
        raise KeyFileError(f"{clients}: no such directory of authorised client keys")
    assert secret is not None
    return ServerKeys(public, secret, clients)


def load_public_key(path: str | Path) -> bytes:
    """A peer's public key from its .key (or .key_secret) file."""
    return _read_cert(Path(path), secret=False)[0]


def load_client_keys(path: str | Path) -> tuple[bytes, bytes]:
    """A client's own key pair from its .key_secret file."""
    public, secret = _read_cert(Path(path), secret=True)
    assert secret is not None
    return public, secret


def keygen(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write NAME.key (public, to hand out) and NAME.key_secret (kept, mode 0600) in
    `directory` (made 0700 if missing); never overwrites."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    public, secret = d / f"{name}.key", d / f"{name}.key_secret"
    for p in (public, secret):
        if p.exists():
            raise KeyFileError(f"{p} exists: not overwritten (choose another --name)")
    old = os.umask(0o077)
    try:
        zmq.auth.create_certificates(d, name)
    finally:
        os.umask(old)
    os.chmod(public, 0o644)
    return public, secret


def key_kind(name: str, kind: str | None = None) -> str:
    """Whose pair `keygen` makes: `kind` when given (one of KINDS), else "server" when
    the name says so as a word (server, robot-server, server2: the docs' --name server),
    else "client". The files are alike; only where each goes differs."""
    if kind is not None:
        if kind not in KINDS:
            raise ValueError(f"key kind {kind!r}: one of {', '.join(KINDS)}")
        return kind
    return "server" if _SERVER_NAME.search(name) else "client"


def set_curve_server(sock: zmq.Socket, keys: ServerKeys) -> None:
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    sock.zap_domain = ZAP_DOMAIN.encode()


def set_curve_client(sock: zmq.Socket, server_public: bytes, public: bytes, secret: bytes) -> None:
    sock.curve_serverkey = server_public
    sock.curve_publickey = public
    sock.curve_secretkey = secret


class AuthorisedClients:
    """The ZAP credentials provider: a key is allowed when its file is in the directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._logged: set[bytes] = set()
        self._bad_files: set[str] = set()

    def _allowed(self) -> set[bytes]:
        keys = set()
        try:
            files = sorted(self.directory.glob("*.key"))[:10_000]
        except OSError as exc:
            log.error("authorised client keys %s: %s", self.directory, exc)
            return keys
        for f in files:
            try:
                keys.add(load_public_key(f))
            except KeyFileError as exc:
                if str(f) not in self._bad_files and len(self._bad_files) < MAX_LOGGED_KEYS:
                    self._bad_files.add(str(f))
                    log.warning("authorised client keys: skipped %s", exc)
        return keys

    def callback(self, domain: str, key: bytes) -> bool:
        if domain == ZAP_DOMAIN and key in self._allowed():
            return True
        if key not in self._logged and len(self._logged) < MAX_LOGGED_KEYS:
            self._logged.add(key)
            log.warning(
                "operator socket: refused a client with CURVE key %s, not in %s "
                "(no answer sent; logged once per key)",
                key.decode(errors="replace"),
                self.directory,
            )
        return False


def start_authenticator(ctx: zmq.Context[Any], keys: ServerKeys) -> AsyncioAuthenticator:
    """Start the ZAP handler on `ctx` (call inside the running event loop); stop() it at
    the end."""
    auth = AsyncioAuthenticator(ctx, log=logging.getLogger("robotd.operator.zap"))
    auth.start()
    auth.configure_curve_callback(ZAP_DOMAIN, AuthorisedClients(keys.clients_dir))
    return auth
