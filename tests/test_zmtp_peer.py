"""What a ZeroMQ peer says of itself, read from its handshake bytes (robotd.stream.zmtp_peer):
each form a peer can take, whole and cut anywhere; and bytes from a peer that may be
anything never raise, never make it read more than MAX_PEER_BYTES, and always come to an
answer once the peer is done. Pure: the raw-connection side is tests/test_link_peer_type.py."""

from __future__ import annotations

import random

import pytest

from robotd.stream.zmtp_peer import (
    GREETING_REST,
    GREETING_SIZE,
    GREETING_START,
    MAX_BODY_BYTES,
    MAX_PEER_BYTES,
    Peer,
    policy_words,
    printable,
    read_peer,
    ready_command,
)

SIGNATURE = bytes.fromhex("ff00000000000000017f")
END = "closed the connection"


def greeting(mechanism: bytes = b"NULL", version: tuple[int, int] = (3, 1)) -> bytes:
    return SIGNATURE + bytes(version) + mechanism.ljust(20, b"\0") + b"\x00" + bytes(31)


def prop(name: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value


def command(name: bytes, body: bytes, *, long: bool = False) -> bytes:
    whole = bytes([len(name)]) + name + body
    if long:
        return b"\x06" + len(whole).to_bytes(8, "big") + whole
    return bytes([0x04, len(whole)]) + whole


def ready(*props: bytes, long: bool = False) -> bytes:
    return command(b"READY", b"".join(props), long=long)


def test_what_this_end_sends_is_a_whole_null_greeting_then_a_dealers_ready() -> None:
    sent = GREETING_START + GREETING_REST
    assert len(sent) == GREETING_SIZE and sent[:10] == SIGNATURE and sent[10:12] == b"\x03\x01"
    assert read_peer(sent + ready_command()) == Peer("3.1", "NULL", "DEALER", known=True)


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (greeting() + ready(prop(b"Socket-Type", b"PUB")), Peer("3.1", "NULL", "PUB", True)),
        # libzmq 4.0 speaks 3.0; names are case-insensitive; other properties come first
        (
            greeting(version=(3, 0))
            + ready(prop(b"Identity", b"\x00\x01"), prop(b"socket-type", b"ROUTER")),
            Peer("3.0", "NULL", "ROUTER", True),
        ),
        (
            greeting() + ready(prop(b"Socket-Type", b"PULL"), long=True),
            Peer("3.1", "NULL", "PULL", True),
        ),
        (greeting() + ready(prop(b"Socket-Type", b"WHAT\x01")), Peer("3.1", "NULL", "WHAT\\x01")),
        (greeting(b"CURVE"), Peer("3.1", "CURVE")),
        (greeting(b"PLAIN"), Peer("3.1", "PLAIN")),
        (greeting(b"KRB5\x07"), Peer("3.1", "KRB5\\x07")),
        (SIGNATURE[:9] + b"\x7f\x01\x08", Peer("2.0", socket_type="PUSH", known=True)),
        (SIGNATURE + b"\x00\x63", Peer("2.0", socket_type="\\x63")),
    ],
)
def test_each_form_a_peer_takes_is_read_whole_and_byte_by_byte(data: bytes, want: Peer) -> None:
    assert read_peer(data) == want
    for cut in range(len(data)):  # nothing is said before the bytes that say it came
        assert read_peer(data[:cut]) is None, cut


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (SIGNATURE + b"\x02", "speaks ZMTP revision 2, which no ZeroMQ release sends"),
        (b"HTTP/1.1 400 Bad", "sent no ZMTP signature"),
        (greeting(b""), "named no security mechanism in its greeting"),
        (greeting() + b"\x00\x03abc", "sent a message where its READY belongs"),
        (greeting() + b"\x80\x00", "sent a frame with flags 0x80 where its READY belongs"),
        (
            greeting() + command(b"ERROR", b"\x0bbad\x00 things"),
            'refused the handshake: ERROR "bad\\x00 things"',
        ),
        (greeting() + command(b"HELLO", b""), 'sent a "HELLO" command where its READY belongs'),
        (greeting() + ready(prop(b"Identity", b"x")), "sent a READY that names no Socket-Type"),
        (
            greeting() + b"\x04\x03\x09REA",
            "sent a command with no whole name where its READY belongs",
        ),
        (
            greeting() + ready(b"\x0bSocket-Type\x00\x00\x00\x09PUB"),
            "sent a READY whose properties run past its end",
        ),
        (
            greeting() + ready(prop(b"X-Pad", b"p" * (MAX_BODY_BYTES + 50)), long=True),
            f"sent a READY over {MAX_BODY_BYTES} bytes with no Socket-Type in them",
        ),
    ],
)
def test_a_peer_that_goes_astray_is_named_for_what_it_did(data: bytes, problem: str) -> None:
    peer = read_peer(data)
    assert peer is not None and peer.problem == problem and peer.socket_type is None, peer


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", f"{END} before its ZMTP version"),
        (SIGNATURE, f"{END} before its ZMTP version"),
        (SIGNATURE + b"\x01", f"{END} before its socket type"),
        (SIGNATURE + b"\x03\x01NU", f"{END} before the rest of its greeting"),
        (greeting(), f"{END} before its READY"),
        (greeting() + b"\x06\x00\x00", f"{END} in its READY"),
        (greeting() + ready(prop(b"Socket-Type", b"PUB"))[:-1], f"{END} in its READY"),
    ],
)
def test_a_peer_that_stops_short_is_said_to_have_stopped_where_it_did(
    data: bytes, problem: str
) -> None:
    assert read_peer(data) is None  # more could still come
    peer = read_peer(data, END)
    assert peer is not None and peer.problem == problem, peer


def test_a_huge_declared_size_reads_no_more_than_the_bound() -> None:
    # A long command that declares 2^63 bytes: the verdict comes from its first
    # MAX_BODY_BYTES, and bytes past MAX_PEER_BYTES are never looked at.
    head = greeting() + b"\x06" + (1 << 63).to_bytes(8, "big")
    body = prop(b"Socket-Type", b"REQ").join([b"\x05READY", b""])
    data = head + body + b"z" * 10_000
    assert read_peer(data) == Peer("3.1", "NULL", "REQ", known=True)
    assert read_peer(data[:MAX_PEER_BYTES]) == read_peer(data)


def test_any_bytes_after_a_signature_never_raise_and_end_in_an_answer() -> None:
    rng = random.Random(20261203)
    seeds = [
        greeting() + ready(prop(b"Socket-Type", b"PUB")),
        greeting() + command(b"ERROR", b"\x03bad"),
        greeting(b"CURVE"),
        SIGNATURE + b"\x01\x05",
    ]
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(0, 6)):  # flip, cut, grow: a peer that may be anything
            op = rng.random()
            if op < 0.5 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif op < 0.75:
                del data[rng.randrange(len(data) + 1) :]
            else:
                data += rng.randbytes(rng.randint(1, 600))
        peer = read_peer(bytes(data), END)
        assert isinstance(peer, Peer)
        assert read_peer(bytes(data)) in (None, peer)  # an answer never changes with the end
        for text in (peer.mechanism or "", peer.socket_type or "", peer.problem):
            assert text.isprintable() and text.isascii(), peer
        assert policy_words(peer).isprintable()


def test_what_is_named_of_a_peer_is_escaped_and_capped() -> None:
    assert printable(b"ok\x1b[2J\n'\"\\") == "ok\\x1b[2J\\x0a\\x27\\x22\\x5c"
    assert printable(b"a" * 30) == "a" * 24 + "..."


@pytest.mark.parametrize(
    ("peer", "said"),
    [
        (Peer("3.1", "NULL", "ROUTER", True), ""),
        (
            Peer("3.1", "NULL", "PUB", True),
            "the endpoint is a ZeroMQ PUB socket: a robotd worker is a ROUTER (`robotd "
            "serve`); is --worker the right socket file?",
        ),
        (
            Peer("2.0", socket_type="REP", known=True),
            "the endpoint is a ZeroMQ REP socket (ZMTP 2.0: a libzmq older than 4): a robotd "
            "worker is a ROUTER (`robotd serve`); is --worker the right socket file?",
        ),
        (
            Peer("3.1", "NULL", "ZAP", False),
            'the endpoint is a ZeroMQ socket of an unknown type "ZAP": a robotd worker is a '
            "ROUTER (`robotd serve`); is --worker the right socket file?",
        ),
        (
            Peer("3.1", "CURVE"),
            "the endpoint is a ZeroMQ socket that asks for CURVE security, which the policy "
            "link does not speak (it speaks NULL: none); is --worker the right socket file?",
        ),
        (
            Peer("3.1", "NULL", problem=f"{END} before its READY"),
            f"the endpoint greeted as a ZeroMQ socket (ZMTP 3.1) but {END} before its READY",
        ),
    ],
)
def test_the_words_name_the_peer_and_where_its_endpoint_came_from(peer: Peer, said: str) -> None:
    assert policy_words(peer, "--worker", "socket file") == said
