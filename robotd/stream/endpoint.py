"""Stream endpoints: `stream+tcp://HOST:PORT` and `stream+ipc:///PATH` name robotd's act
link on a raw byte stream (robotd.stream.framing) instead of a ZeroMQ socket; the part
after `stream+` is what the same endpoint would be for ZeroMQ."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

TCP = "stream+tcp://"
IPC = "stream+ipc://"


class EndpointError(ValueError):
    """An endpoint that does not name a stream address; the message says why."""


@dataclass(frozen=True)
class StreamAddress:
    family: int  # socket.AF_INET, AF_INET6 or AF_UNIX
    address: tuple[str, int] | str  # (host, port) or a path


def is_stream(endpoint: str) -> bool:
    return endpoint.startswith((TCP, IPC))


def zmq_equivalent(endpoint: str) -> str:
    """`stream+tcp://h:p` -> `tcp://h:p`, `stream+ipc://x` -> `ipc://x` (for deriving the
    observe endpoint, which is ZeroMQ)."""
    return endpoint.removeprefix("stream+")


def parse(endpoint: str, *, bind: bool = False) -> StreamAddress:
    """The address `endpoint` names (`bind`: HOST may be `*`, PORT 0)."""
    if endpoint.startswith(IPC):
        path = endpoint[len(IPC) :]
        if not path:
            raise EndpointError(f"{endpoint!r}: no socket path")
        if len(path.encode()) > 107:
            raise EndpointError(f"{endpoint!r}: the path is over 107 bytes (a unix socket's)")
        return StreamAddress(socket.AF_UNIX, path)
    if not endpoint.startswith(TCP):
        raise EndpointError(f"{endpoint!r}: not a stream endpoint ({TCP}HOST:PORT or {IPC}PATH)")
    host, sep, port = endpoint[len(TCP) :].rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise EndpointError(f"{endpoint!r}: want {TCP}HOST:PORT")
    number = int(port)
    if not (0 if bind else 1) <= number <= 65535:
        raise EndpointError(f"{endpoint!r}: port {number} is out of range")
    if host == "*":
        if not bind:
            raise EndpointError(f"{endpoint!r}: '*' is for binding; connect to a host")
        host = "0.0.0.0"
    problem = _bracket_problem(endpoint, host)
    if problem is not None:
        raise EndpointError(problem)
    if host.startswith("[") and host.endswith("]"):
        return StreamAddress(socket.AF_INET6, (host[1:-1], number))
    return StreamAddress(socket.AF_INET, (host, number))


def port_problem(endpoint: str) -> str | None:
    """Why the tcp port an endpoint names cannot be connected to (`tcp://`, `stream+tcp://`:
    HOST:PORT; `ws://`, `wss://`: the port may be left to the scheme), else None (also
    for endpoints that name no port: ipc)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "stream+tcp", "ws", "wss"):
        return None
    netloc = rest.split("/", 1)[0].rpartition("@")[2]
    host, colon, port = netloc.rpartition(":")
    if not colon or "]" in port:  # no port (or an [ipv6] address without one)
        return None if scheme in ("ws", "wss") else f"{endpoint!r}: want {scheme}://HOST:PORT"
    if not port.isdigit():
        return f"{endpoint!r}: port {port!r} is not a number"
    if not 1 <= int(port) <= 65535:
        return f"{endpoint!r}: port {int(port)} is out of range"
    if not host:
        return f"{endpoint!r}: no host"
    return _bracket_problem(endpoint, host)


def _bracket_problem(endpoint: str, host: str) -> str | None:
    """An IPv6 host is written whole in brackets, [::1]; a bare or half-bracketed one ('::1',
    '[::1') would only fail at connect time, far from the config that named it."""
    bracketed = host.startswith("[") and host.endswith("]")
    inner = host[1:-1] if bracketed else host
    if "[" in inner or "]" in inner or (":" in inner and not bracketed):
        return f"{endpoint!r}: host {host!r}: an IPv6 address goes whole in brackets, [::1]"
    return None


def worker_problem(endpoint: str) -> str | None:
    """Why `endpoint` cannot name a robotd worker (stream+tcp://, stream+ipc://, tcp://,
    ipc://, its port checked), else None: one rule for policy.worker at load and --worker."""
    if is_stream(endpoint):
        try:
            parse(endpoint)
        except EndpointError as err:
            return str(err)
        return None
    if not endpoint.startswith(("tcp://", "ipc://")):
        openpi = endpoint.startswith(("ws://", "wss://"))
        hint = ' (ws:// and wss:// are for policy.link = "openpi")' if openpi else ""
        return (
            f"{endpoint!r}: a robotd worker listens on stream+tcp://HOST:PORT, "
            f"stream+ipc://PATH, tcp://HOST:PORT or ipc://PATH{hint}"
        )
    return port_problem(endpoint)


def ipc_file(endpoint: str) -> Path | None:
    """The socket file a stream ipc endpoint makes (None for tcp)."""
    if endpoint.startswith(IPC):
        return Path(endpoint[len(IPC) :])
    return None


def connect_socket(addr: StreamAddress) -> socket.socket:
    """A non-blocking socket for `addr`, its options set for small round trips."""
    sock = socket.socket(addr.family, socket.SOCK_STREAM)
    sock.setblocking(False)
    if addr.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def bound_endpoint(sock: socket.socket, addr: StreamAddress) -> str:
    """The endpoint a bound socket listens on (for tcp port 0: the port chosen)."""
    if addr.family == socket.AF_UNIX:
        return IPC + str(addr.address)
    host, port = sock.getsockname()[:2]
    return f"{TCP}[{host}]:{port}" if addr.family == socket.AF_INET6 else f"{TCP}{host}:{port}"
