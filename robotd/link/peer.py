"""Why a ZeroMQ endpoint does not answer hello, found out over a raw connection to it:
ZeroMQ itself does not say. A DEALER whose peer refuses the connection, speaks no ZeroMQ,
is a socket of the wrong type or asks for security retries in silence, for ever.

One connection, read-only as far as the peer's application can tell: what it greets with
(robotd.stream.zmtp: the signature, else no ZeroMQ at all), then, for a ZeroMQ peer, its
ZMTP handshake followed as the NULL mechanism (robotd.stream.zmtp_peer: its version,
mechanism and socket type). No message frame is ever sent, at most MAX_PEER_BYTES are read
and each stage waits GREETING_WAIT_S at most; the connection is closed on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass

import anyio

from robotd.stream import zmtp, zmtp_peer
from robotd.stream.zmtp_peer import GREETING_REST, GREETING_SIZE, GREETING_START, Peer

GREETING_WAIT_S = 0.5  # a ZeroMQ socket greets a connection at once: this is generous
CONNECT_WAIT_S = 1.0
QUIET = f"went quiet for {GREETING_WAIT_S:g} s"


@dataclass(frozen=True)
class Diagnosis:
    """Why no robotd worker answers at an endpoint: `text` ("" when a ROUTER is there,
    or for an endpoint not looked at); `not_worker`: the peer said what it is, a ZeroMQ
    socket of another type or one that asks for security, so it is no robotd worker."""

    text: str
    not_worker: bool = False


async def diagnose(endpoint: str, source: str = "policy.worker") -> Diagnosis:
    """Why no ZeroMQ ROUTER answers at `endpoint` (`source`: where it came from, named in
    the words): "connection refused" for a tcp port or socket file with no listener, "no
    socket file" for an ipc path; a listener that accepts a connection but sends no
    ZeroMQ greeting (a ZeroMQ socket sends one at once) is named so, with the stream
    endpoint it may be; a ZeroMQ socket of another type, or one asking for CURVE or PLAIN
    security, or older than ZMTP 3, is named so. "" for a ROUTER (or other endpoints)."""
    if endpoint.startswith("ipc://"):
        path = endpoint.removeprefix("ipc://")
        if not os.path.exists(path):
            return Diagnosis(f"no socket file {path}")
        where = f"the socket {path}"
    elif endpoint.startswith("tcp://"):
        host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        where = f"{host}:{port}"
    else:
        return Diagnosis("")
    try:
        with anyio.fail_after(CONNECT_WAIT_S):  # asyncio's: anyio's connect_tcp hides the errno
            if endpoint.startswith("ipc://"):
                reader, writer = await asyncio.open_unix_connection(path)
            else:
                reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except TimeoutError:
        return Diagnosis(f"no connection to {where} within {CONNECT_WAIT_S:g} s")
    except (OSError, ValueError) as exc:
        code = getattr(exc, "errno", None)
        text = os.strerror(code) if isinstance(code, int) and code > 0 else str(exc)
        return Diagnosis((text or type(exc).__name__).lower())
    try:
        return await _what_answers(endpoint, source, reader, writer)
    finally:
        await _close(writer)


async def _what_answers(
    endpoint: str, source: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Diagnosis:
    head, ended = await _signature(reader)
    if not zmtp.verdict(head):
        return Diagnosis(_no_greeting(endpoint, head, ended))
    peer = await handshake(reader, writer, head)
    what = "port" if endpoint.startswith("tcp://") else "socket file"
    text = zmtp_peer.policy_words(peer, source, what)
    return Diagnosis(text, not_worker=bool(text) and not peer.problem)


async def _signature(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """The peer's first bytes, up to the signature's 10 (fewer once they tell it is none),
    within GREETING_WAIT_S; and whether it closed the connection meanwhile."""
    head = b""
    with anyio.move_on_after(GREETING_WAIT_S), contextlib.suppress(OSError):
        while zmtp.verdict(head) is None:
            more = await reader.read(zmtp.SIGNATURE_SIZE - len(head))
            if not more:
                return head, True
            head += more
    return head, False


def _no_greeting(endpoint: str, head: bytes, ended: bool) -> str:
    """What to say of a listener at `endpoint` whose first bytes, `head`, are no ZMTP
    signature (`ended`: it closed the connection)."""
    kind = "a TCP connection" if endpoint.startswith("tcp://") else "a connection"
    if head:
        came = f"answered with bytes that are no ZeroMQ greeting ({head.hex(' ')})"
    elif ended:
        came = "closed it with no ZeroMQ greeting"
    else:
        came = f"sent no ZeroMQ greeting within {GREETING_WAIT_S:g} s"
    return (
        f"the endpoint accepted {kind} but {came}: not a ZeroMQ socket (a worker on "
        f"robotd's stream framing? connect with {zmtp.stream_endpoint(endpoint)})"
    )


async def handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes
) -> Peer:
    """Follow the ZMTP handshake of a peer that opened with `head` (its signature) as a
    NULL-mechanism DEALER would, to what it says of itself (zmtp_peer.read_peer).

    Our greeting goes in libzmq's stages, so that the peer says all it will before it can
    object: the signature and major version first (a libzmq peer sends the rest of its
    greeting only then); the rest (NULL) only once the peer's greeting says NULL (a
    libzmq peer that reads a mechanism other than its own closes the connection at once,
    its own greeting unsent). A libzmq peer sends its READY without waiting for ours; ours
    (Socket-Type DEALER) goes only if the peer's has not come within GREETING_WAIT_S, for
    peers that wait for it, since a peer of a type that cannot talk to a DEALER closes the
    connection on reading it, maybe before its own READY is out. Each stage waits
    GREETING_WAIT_S at most; never raises."""
    data = bytearray(head)
    end = "reset the connection"
    try:
        writer.write(GREETING_START)
        stage, deadline = 1, time.monotonic() + GREETING_WAIT_S
        while (peer := zmtp_peer.read_peer(data)) is None:
            if stage == 1 and len(data) >= GREETING_SIZE:  # undecided: it said NULL
                writer.write(GREETING_REST)
                stage, deadline = 2, time.monotonic() + GREETING_WAIT_S
            more = await _read(reader, zmtp_peer.MAX_PEER_BYTES - len(data), deadline)
            if more is None and stage == 2:  # no READY yet: it may wait for ours
                writer.write(zmtp_peer.ready_command())
                stage, deadline = 3, time.monotonic() + GREETING_WAIT_S
            elif not more:
                end = "closed the connection" if more == b"" else QUIET
                break
            else:
                data += more
        else:
            return peer
    except OSError:
        pass
    return zmtp_peer.read_peer(data, end) or Peer(problem=end)


async def _read(reader: asyncio.StreamReader, n: int, deadline: float) -> bytes | None:
    """Up to `n` bytes (b"": the peer closed the connection), None at `deadline`."""
    with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
        return await reader.read(n)
    return None


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close the connection whatever state it is in, even while cancelled (bounded)."""
    writer.close()
    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0), contextlib.suppress(OSError):
        await writer.wait_closed()
