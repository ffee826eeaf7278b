"""What a ZeroMQ peer says of itself in its handshake, read from the bytes it sent: its
ZMTP version, its security mechanism and (NULL security) its socket type. Pure: no I/O
(robotd.link.peer holds the raw connection and feeds what came here).

A ZMTP 3.x greeting (rfc 23/ZMTP, 37/ZMTP) is 64 bytes: the signature (robotd.stream.zmtp),
the major and minor version, the mechanism (20 bytes of ASCII, NUL-padded), as-server, 31
bytes of filler. libzmq sends it in stages: the signature at once, its major version once
it has read the other end's signature, the rest once it has read the other end's major
version, so that it can fall back for an older peer. A peer older than ZMTP 3 (revision 0
or 1: ZMTP 2.0, libzmq 3.x) sends instead its revision and then its socket type, one byte.

Under NULL security each end then sends a READY command: a command frame (flags 0x04 and a
one-byte size, or 0x06 and an eight-byte big-endian size) whose body is the name's size,
the name "READY", then properties (a one-byte name size, the name, a four-byte big-endian
value size, the value), one of them Socket-Type (names are case-insensitive). A peer that
refuses sends an ERROR command instead: a one-byte reason size and the reason.

Everything here comes from a peer that may be anything (a program of another kind, a
scanner, garbage): every function takes any bytes, never raises, and looks at no more than
MAX_PEER_BYTES of them; what it names of the peer's words is escaped to printable ASCII.
"""

from __future__ import annotations

from dataclasses import dataclass

from robotd.stream.zmtp import SIGNATURE_SIZE, verdict

GREETING_SIZE = 64
MECHANISM_AT, MECHANISM_SIZE = 12, 20
MAX_BODY_BYTES = 320  # of a READY: libzmq's is ~40; the type comes first in it
MAX_PEER_BYTES = GREETING_SIZE + 9 + MAX_BODY_BYTES  # the most a probe ever reads: 393
SHORT_COMMAND, LONG_COMMAND = 0x04, 0x06
SECURITY = frozenset({"PLAIN", "CURVE", "GSSAPI"})
# ZMTP 2.0 names its socket type by libzmq's number (rfc 15/ZMTP; zmq.h)
ZMTP2_TYPES = ("PAIR", "PUB", "SUB", "REQ", "REP", "DEALER", "ROUTER", "PULL", "PUSH", "XPUB",
               "XSUB", "STREAM")  # fmt: skip
KNOWN_TYPES = frozenset(ZMTP2_TYPES) | {"SERVER", "CLIENT", "RADIO", "DISH", "GATHER",
                                        "SCATTER", "DGRAM", "PEER", "CHANNEL"}  # fmt: skip
KNOWN_TYPES_BYTES = frozenset(t.encode() for t in KNOWN_TYPES)

# What this end sends (robotd.link.peer): a libzmq-like signature (its padding a big-endian
# 1, for ZMTP 1.0 peers) and major version 3 first; the rest of a NULL greeting (minor 1,
# as-server 0) only once the peer's mechanism is known to be NULL; then a READY as a DEALER.
GREETING_START = bytes.fromhex("ff00000000000000017f") + b"\x03"
GREETING_REST = b"\x01" + b"NULL".ljust(MECHANISM_SIZE, b"\0") + b"\x00" + bytes(31)


def ready_command(socket_type: bytes = b"DEALER") -> bytes:
    """A READY command frame whose only property is Socket-Type `socket_type`."""
    body = b"\x05READY" + b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big") + socket_type
    return bytes([SHORT_COMMAND, len(body)]) + body


@dataclass(frozen=True)
class Peer:
    """What the peer said of itself, as far as it went. `version` is "3.1", "2.0" and so
    on ("" before its version came); `mechanism` and `socket_type` are printable (escaped),
    None while unsaid; `known` is whether `socket_type` is one ZeroMQ has. `problem` is
    why the handshake could not be followed to the socket type (then `socket_type` is None
    and, for a mechanism other than NULL, so is `problem`: that is the answer)."""

    version: str = ""
    mechanism: str | None = None
    socket_type: str | None = None
    known: bool = False
    problem: str = ""

    @property
    def old(self) -> bool:
        """Older than ZMTP 3 (a libzmq 3.x)."""
        return self.version.startswith(("0.", "1.", "2."))


def printable(data: bytes, cap: int = 24) -> str:
    """`data` as text a log line can hold: printable ASCII kept (bar quote and backslash),
    other bytes as \\xNN, at most `cap` bytes of it ("..." when there was more)."""
    text = "".join(
        chr(c) if 0x20 <= c < 0x7F and c not in (0x22, 0x27, 0x5C) else f"\\x{c:02x}"
        for c in data[:cap]
    )
    return text + ("..." if len(data) > cap else "")


def read_peer(data: bytes, end: str | None = None) -> Peer | None:
    """What the peer whose bytes so far (from its first) are `data` says of itself; None
    while more must come to tell. `end`: why no more will come ("closed the connection",
    "went quiet for 0.5 s"); then the answer is never None. Only data that opens with a
    ZMTP signature is a peer's handshake."""
    data = bytes(data[:MAX_PEER_BYTES])
    told = verdict(data)
    if told is None or len(data) <= SIGNATURE_SIZE:
        return None if end is None else Peer(problem=f"{end} before its ZMTP version")
    if told is False:
        return Peer(problem="sent no ZMTP signature")
    major = data[SIGNATURE_SIZE]
    if major < 2:  # ZMTP 2.0 framing (revision 0 or 1): the socket type follows, one byte
        if len(data) < SIGNATURE_SIZE + 2:
            return None if end is None else Peer("2.0", problem=f"{end} before its socket type")
        number = data[SIGNATURE_SIZE + 1]
        if number < len(ZMTP2_TYPES):
            return Peer("2.0", socket_type=ZMTP2_TYPES[number], known=True)
        return Peer("2.0", socket_type=f"\\x{number:02x}")
    if major == 2:
        return Peer("2", problem="speaks ZMTP revision 2, which no ZeroMQ release sends")
    if len(data) < GREETING_SIZE:
        return None if end is None else Peer(problem=f"{end} before the rest of its greeting")
    peer = _greeting(data)
    if peer.problem or peer.mechanism != "NULL":
        return peer
    return _ready(data[GREETING_SIZE:], end, peer)


def _greeting(data: bytes) -> Peer:
    """The version and mechanism of a whole ZMTP 3.x greeting (`data` at least 64 bytes)."""
    version = f"{data[SIGNATURE_SIZE]}.{data[SIGNATURE_SIZE + 1]}"
    raw = data[MECHANISM_AT : MECHANISM_AT + MECHANISM_SIZE].rstrip(b"\0")
    if not raw:
        return Peer(version, problem="named no security mechanism in its greeting")
    return Peer(version, mechanism=printable(raw, MECHANISM_SIZE))


def _ready(rest: bytes, end: str | None, peer: Peer) -> Peer | None:
    """The socket type the first command after a NULL greeting says (`rest`: what came
    after the greeting), None while more must come."""
    version, mechanism = peer.version, peer.mechanism
    if not rest:
        return None if end is None else Peer(version, mechanism, problem=f"{end} before its READY")
    flags = rest[0]
    if flags not in (SHORT_COMMAND, LONG_COMMAND):
        said = "a message" if flags <= 0x03 else f"a frame with flags 0x{flags:02x}"
        return Peer(version, mechanism, problem=f"sent {said} where its READY belongs")
    header = 2 if flags == SHORT_COMMAND else 9
    if len(rest) < header:
        return None if end is None else Peer(version, mechanism, problem=f"{end} in its READY")
    size = int.from_bytes(rest[1:header], "big")
    body = rest[header : header + min(size, MAX_BODY_BYTES)]
    whole = len(body) == size
    if not whole and len(body) < MAX_BODY_BYTES:
        return None if end is None else Peer(version, mechanism, problem=f"{end} in its READY")
    return Peer(version, mechanism, *_command(body, whole))


def _command(body: bytes, whole: bool) -> tuple[str | None, bool, str]:
    """(socket type, known, problem) from a command's body (`whole`: all of it; else its
    first MAX_BODY_BYTES)."""
    n = body[0] if body else 0
    name = body[1 : 1 + n]
    if not body or len(name) < n:
        return None, False, "sent a command with no whole name where its READY belongs"
    if name == b"ERROR":
        reason = body[2 + n : 2 + n + body[1 + n]] if len(body) > 1 + n else b""
        return None, False, f'refused the handshake: ERROR "{printable(reason, 60)}"'
    if name != b"READY":
        return None, False, f'sent a "{printable(name)}" command where its READY belongs'
    value, problem = _socket_type(body[1 + n :], whole)
    if value is None:
        return None, False, problem
    return printable(value), value.upper() in KNOWN_TYPES_BYTES, ""


def _socket_type(props: bytes, whole: bool) -> tuple[bytes | None, str]:
    """The Socket-Type value among a READY's properties, else (None, why not)."""
    at = 0
    while at < len(props):
        n = props[at]
        name = props[at + 1 : at + 1 + n]
        at += 1 + n
        size = int.from_bytes(props[at : at + 4], "big") if at + 4 <= len(props) else -1
        at += 4
        value = props[at : at + size] if size >= 0 else b""
        if size < 0 or len(name) < n or len(value) < size:
            break  # runs past what came
        at += size
        if name.lower() == b"socket-type":
            return value, ""
    else:
        return None, "sent a READY that names no Socket-Type"
    if whole:
        return None, "sent a READY whose properties run past its end"
    return None, f"sent a READY over {MAX_BODY_BYTES} bytes with no Socket-Type in them"


def policy_words(peer: Peer, source: str = "policy.worker", what: str = "port") -> str:
    """What to tell the user of a peer where a robotd worker (a ROUTER, NULL security)
    was expected, `source` naming where its endpoint came from and `what` it names (a
    port, a socket file); "" for a ROUTER: then what keeps hello unanswered is elsewhere."""
    ask = f"is {source} the right {what}?"
    if peer.socket_type == "ROUTER":
        return ""
    if peer.socket_type is not None:
        kind = f"{peer.socket_type} socket" if peer.known else (
            f"socket of an unknown type \"{peer.socket_type}\"")  # fmt: skip
        old = f" (ZMTP {peer.version}: a libzmq older than 4)" if peer.old else ""
        return (
            f"the endpoint is a ZeroMQ {kind}{old}: a robotd worker is a ROUTER "
            f"(`robotd serve`); {ask}"
        )
    if peer.mechanism is not None and not peer.problem:
        asked = f"{peer.mechanism} security" if peer.mechanism in SECURITY else (
            f'an unknown security mechanism "{peer.mechanism}"')  # fmt: skip
        return (
            f"the endpoint is a ZeroMQ socket that asks for {asked}, which the "
            f"policy link does not speak (it speaks NULL: none); {ask}"
        )
    version = f" (ZMTP {peer.version})" if peer.version else ""
    return f"the endpoint greeted as a ZeroMQ socket{version} but {peer.problem}"
