"""Endpoint parsing, TLS and the `GET /healthz` poll that paces reconnection.

openpi's WebsocketPolicyServer answers `GET /healthz` with 200 "OK" before any websocket
handshake; serving engines in front of a pool answer 503 while no replica is ready. The
poll runs stdlib `http.client` in a worker thread and connects directly (no proxy), as the
websocket does. The socket timeout bounds each read, not the answer, so a timer cuts the
socket at the poll's own timeout: a server trickling its answer a byte at a time cannot
keep the thread (abandoned by the cancelled attempt) and its socket for ever.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import anyio.to_thread

MAX_BODY = 1024  # bytes of a health answer read (and shown in an error)


@dataclass(frozen=True)
class Endpoint:
    """A checked ws:// or wss:// endpoint."""

    url: str
    secure: bool
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """ValueError naming the problem for anything but ws[s]://host[:port][/path]."""
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss"):
            raise ValueError(f"openpi endpoint {url!r}: expected ws://host:port or wss://...")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"openpi endpoint {url!r}: bad port") from None
        if not parts.hostname:
            raise ValueError(f"openpi endpoint {url!r}: no host")
        secure = parts.scheme == "wss"
        return cls(url, secure, parts.hostname, port or (443 if secure else 80))


def tls_context(ca_file: str) -> ssl.SSLContext:
    """A verifying client context: the system's CAs, or `ca_file`'s; ValueError naming
    policy.openpi.ca_file when that file is missing, unreadable or holds no certificate."""
    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:  # FileNotFoundError, PermissionError, bad PEM
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"policy.openpi.ca_file {ca_file!r}: {why}"[:500]) from None


def _get(
    ep: Endpoint, path: str, headers: dict[str, str], ctx: ssl.SSLContext | None, timeout: float
) -> tuple[int, bytes]:
    conn: http.client.HTTPConnection
    if ep.secure:
        conn = http.client.HTTPSConnection(ep.host, ep.port, timeout=timeout, context=ctx)
    else:
        conn = http.client.HTTPConnection(ep.host, ep.port, timeout=timeout)
    cut = threading.Event()
    timer = threading.Timer(timeout, _cut, (conn, cut))
    timer.daemon = True
    timer.start()
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(MAX_BODY)
    except (OSError, http.client.HTTPException):
        if cut.is_set():  # what the cut socket raised (a reset, a short read) is ours
            raise TimeoutError(f"timed out: no whole answer within {timeout:g} s") from None
        raise
    finally:
        timer.cancel()
        conn.close()


def _cut(conn: http.client.HTTPConnection, cut: threading.Event) -> None:
    """Wake a read blocked on the connection's socket (close alone does not), ending it."""
    cut.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


async def not_ready(
    ep: Endpoint,
    path: str,
    headers: dict[str, str],
    ctx: ssl.SSLContext | None,
    timeout: float,
) -> str | None:
    """Why the server is not worth a connection attempt now, or None when it may be.

    2xx: ready. 5xx and 429: the server says it is not (yet) ready. Any other status (a
    server without a health endpoint answers 404 or 426): worth a try, the handshake will
    tell. No answer (refused, reset, timed out, TLS failure): not ready, with the reason.
    """
    try:
        status, body = await anyio.to_thread.run_sync(
            _get, ep, path, headers, ctx, timeout, abandon_on_cancel=True
        )
    except (OSError, http.client.HTTPException) as exc:
        return f"GET {path}: {type(exc).__name__}: {exc}"
    if status >= 500 or status == 429:
        text = body.decode("utf-8", "replace").strip()[:200]
        return f"GET {path} answered {status} {text}".rstrip()
    return None
