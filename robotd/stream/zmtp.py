"""Telling a ZeroMQ peer by its first bytes, so that a stream endpoint and a ZeroMQ one
mixed up say so instead of failing as a broken or silent connection.

Every ZMTP greeting since 2.0 (rfc 15/ZMTP, 23/ZMTP 3.0, 37/ZMTP 3.1) opens with a
10-byte signature: 0xFF, 8 bytes of padding (libzmq sends a big-endian 1 there, for
ZMTP 1.0 peers), 0x7F. Both ends send it as soon as the connection is up, before reading
anything: a DEALER that connects and a ROUTER that accepts alike.

robotd's stream framing (robotd.stream.framing) opens with a little-endian u32 frame count
then the first frame's u64 length: byte 9 is bits 40..47 of that length. So a stream that
opens with a ZMTP signature declares a first frame of at least 0x7F << 40 bytes (~140 TB),
which no reader's `max_bytes` admits: no valid robotd stream looks like one, and the test
is exact, not a guess. (A first byte 0xFF alone is no proof: a message of 255 frames
begins so.)
"""

from __future__ import annotations

SIGNATURE_SIZE = 10
FIRST, LAST = 0xFF, 0x7F  # the signature's first and last byte


def verdict(head: bytes | bytearray | memoryview) -> bool | None:
    """Whether a stream whose first bytes are `head` opens with a ZMTP signature: True,
    False, or None while too few bytes have come to tell."""
    if not head:
        return None
    if head[0] != FIRST:
        return False
    if len(head) < SIGNATURE_SIZE:
        return None
    return head[SIGNATURE_SIZE - 1] == LAST


def stream_endpoint(endpoint: str) -> str:
    """The stream endpoint of the same address: `tcp://h:p` -> `stream+tcp://h:p` (the
    other way: robotd.stream.endpoint.zmq_equivalent)."""
    return endpoint if endpoint.startswith("stream+") else "stream+" + endpoint


def zeromq_peer(endpoint: str) -> str:
    """What a stream client at `endpoint` (stream+tcp://, stream+ipc://) says when the
    peer greeted it as ZeroMQ does."""
    zeromq = endpoint.removeprefix("stream+")
    return (
        f"the peer at {endpoint} speaks ZeroMQ (connect with {zeromq}, or serve the worker "
        f"on {endpoint}): not robotd's stream framing"
    )
