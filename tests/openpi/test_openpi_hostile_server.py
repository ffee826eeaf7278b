"""The openpi link against a hostile server (hostile_server.py: real sockets on loopback,
websockets' own handshake and parser, every byte after it the test's choice): bad
metadata, bad replies, frames claiming gigabytes, a close mid-frame, pongs never sent,
a server gone while the link is idle, a /healthz that trickles. Each ends in one typed
error naming what was wrong, nothing unbounded taken in, the link still usable. The
daemon's side (the robot holds, the loop ticks, a new episode after a reconnect) is in
test_openpi_hostile_daemon.py."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import anyio
import msgpack
import numpy as np
import pytest
from hostile_server import Hostile, Peer, await_until, wait_until

from robotd.link.openpi import codec
from robotd.link.openpi.client import OpenpiLink
from robotd.link.openpi.errors import BadReply, ConnectionLost, ServerError
from robotd.link.openpi.options import ActionsMap, OpenpiOptions
from robotd.link.openpi.request import parse_reply

FAST = OpenpiOptions(backoff_initial_s=0.02, backoff_max_s=0.1, connect_timeout_s=5)
DEADLINE_S = 30.0
GOOD = codec.packb({"actions": np.zeros((4, 2), np.float32)})


def nd(dtype: str, shape: list[int], data: bytes) -> dict[bytes, Any]:
    """An openpi ndarray map saying whatever it likes about its own bytes."""
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


def bomb(nbytes: int) -> bytes:
    """About `nbytes` of msgpack that decode to a list of lists of empty lists: one byte
    each on the wire, 56 bytes (and a walk) each in Python."""
    inner = b"\xdc\xff\xff" + b"\x90" * 0xFFFF
    n = nbytes // len(inner)
    return b"\xdc" + n.to_bytes(2, "big") + inner * n


def answering(*replies: Any, metadata: bytes = b"\x80", unasked: bytes = b"") -> Any:
    """The metadata frame (and `unasked`, if any, right after it), then replies[n] for the
    n-th request (counted over every connection; bytes or str sent as a frame, a callable
    called with the peer), then GOOD."""
    count = [0]

    async def script(peer: Peer) -> None:
        peer.send(metadata)
        if unasked:
            peer.send(unasked)
        while await peer.request() is not None:
            n = count[0]
            reply = replies[n] if n < len(replies) else GOOD
            count[0] += 1
            if callable(reply):
                await reply(peer)
            else:
                peer.send(reply)

    return script


def run(main: Any) -> None:
    anyio.run(main)


@pytest.mark.parametrize(
    "metadata, error",
    [
        (b"\xc1", "metadata frame: not a valid msgpack"),
        (msgpack.packb({1: "int key"}), "metadata frame: not a valid msgpack"),
        (msgpack.packb({"x": msgpack.ExtType(7, b"?")}), "extension type 7"),
        (msgpack.packb(["a", "list"]), "metadata frame: not a map but list"),
        (bomb(2 << 20), "metadata frame: more than 1048576 items"),
    ],
)
def test_bad_metadata_is_a_named_connect_error(metadata: bytes, error: str) -> None:
    with Hostile(answering(metadata=metadata)) as server:

        async def main() -> None:
            link = OpenpiLink(server.url, FAST)
            with pytest.raises(ConnectionLost, match="no connection within"):
                await link.connect(deadline_s=1.0)
            assert error in link.state.last_error and not link.connected

        run(main)


def test_metadata_claiming_2_gb_is_refused_by_its_header() -> None:
    """A frame header claiming 2 GiB: refused (1009) before a byte of it is read."""

    async def script(peer: Peer) -> None:
        peer.send_raw(Peer.header(2 << 30) + b"\x80" * 1000)
        await peer.hang()

    with Hostile(script) as server:

        async def main() -> None:
            link = OpenpiLink(server.url, FAST)
            with pytest.raises(ConnectionLost):
                await link.connect(deadline_s=1.0)
            assert "before sending its metadata" in link.state.last_error
            assert "code 1009" in link.state.last_error

        run(main)


def test_big_metadata_is_shown_small() -> None:
    """Repro: metadata nested four deep (half a million ints, 0.5 MB) was shown in status
    whole: every robotctl status and telemetry message carried megabytes of it."""
    deep = {f"k{i}": [[list(range(16))] * 32] * 32 for i in range(32)}
    with Hostile(answering(metadata=codec.packb(deep))) as server:

        async def main() -> None:
            link = OpenpiLink(server.url, FAST)
            metadata = await link.connect(deadline_s=DEADLINE_S)
            assert len(metadata) == 32  # the link's caller still has it all
            shown = json.dumps(link.state.metadata)
            assert len(shown) < 16 << 10, len(shown)
            await link.close()

        run(main)


ACTIONS = ActionsMap()
BAD_REPLIES = [
    (b"\xc1", "not a valid msgpack"),
    (b"\x81\xa7actions", "truncated message"),
    (msgpack.packb({"actions": msgpack.ExtType(1, b"\x00" * 16)}), "extension type 1"),
    (codec.packb({"actions": nd("<f4", [10, 2], b"\0" * 4)}), "needs 80 data bytes, got 4"),
    (codec.packb({"actions": nd("<f4", [1 << 29, 1], b"\0" * 8)}), "needs 2147483648 data"),
    (codec.packb({"actions": nd("|O", [1, 2], b"\0" * 16)}), "dtype '|O' not allowed"),
    (codec.packb({"actions": nd("<f4", [-1, 2], b"")}), "non-negative integers"),
    (codec.packb({"actions": np.zeros(8, np.float32)}), "expected H x D rows"),
    (codec.packb({"actions": np.zeros((2, 2, 2), np.float32)}), "expected H x D rows"),
    (codec.packb({"actions": np.full((2, 2), np.nan, np.float32)}), "NaN or infinity"),
    (codec.packb({"actions": np.zeros((20_000, 2), np.float16)}), "at most 10000"),
    (codec.packb({"actions": np.zeros((2, 3), np.float32)}), "rows of 3 columns"),
    (codec.packb({"actions": np.zeros((2, 2), np.int32)}), "int32"),
    (codec.packb({"nothing": 1}), "has no 'actions'"),
    (b"\x81\xa7actions" + bomb(2 << 20), "more than 1048576 items"),
]


def test_bad_replies_are_named_and_the_connection_stays() -> None:
    """Each reply refused naming its field (the act alone fails), and the next act gets
    its own good answer on the same connection. The 2 MiB of nested empty lists took
    seconds and hundreds of MB to decode before the item budget."""
    with Hostile(answering(*(r for r, _ in BAD_REPLIES))) as server:

        async def main() -> None:
            link = OpenpiLink(server.url, FAST)
            await link.connect(deadline_s=DEADLINE_S)
            for _reply, words in BAD_REPLIES:
                t0 = time.monotonic()
                with pytest.raises(BadReply, match=words):
                    parse_reply(ACTIONS, await link.act({"x": 1}, DEADLINE_S), joints=2)
                assert time.monotonic() - t0 < 5, words  # no decode that runs for seconds
                assert link.state.connected
            reply = await link.act({"x": 1}, DEADLINE_S)
            assert parse_reply(ACTIONS, reply, joints=2).rows.shape == (4, 2)
            assert link.state.connects == 1
            await link.close()

        run(main)


async def _text(peer: Peer) -> None:
    peer.send("Traceback (most recent call last):\n  ...\nValueError: no such key\n")


async def _header_2gb(peer: Peer) -> None:
    peer.send_raw(Peer.header(2 << 30) + b"\0" * 4096)


async def _half_then_gone(peer: Peer) -> None:
    peer.send_raw(Peer.header(1000) + b"\x81" * 10)
    await asyncio.sleep(0)
    peer.abort()


async def _close_1011(peer: Peer) -> None:
    peer.close(1011, "x" * 120)


@pytest.mark.parametrize(
    "reply, error, words",
    [
        (_text, ServerError, "server error instead of a reply: ValueError: no such key"),
        (_header_2gb, ConnectionLost, "closed by robotd: code 1009"),
        (b"\0" * (2 << 10), ConnectionLost, "closed by robotd: code 1009"),
        (_half_then_gone, ConnectionLost, "closed during an act .no close frame"),
        (_close_1011, ServerError, "server closed with 1011"),
    ],
)
def test_replies_that_end_the_connection(reply: Any, error: type, words: str) -> None:
    opts = FAST.model_copy(update={"max_reply_bytes": 1 << 10})
    with Hostile(answering(reply)) as server:

        async def main() -> None:
            link = OpenpiLink(server.url, opts)
            await link.connect(deadline_s=DEADLINE_S)
            with pytest.raises(error, match=words):
                await link.act({"x": 1}, DEADLINE_S)
            assert not link.state.connected and words.split(" ")[0] in link.state.last_error
            await link.connect(deadline_s=DEADLINE_S)  # a new connection answers again
            assert (await link.act({"x": 1}, DEADLINE_S))["actions"].shape == (4, 2)
            await link.close()

        run(main)


ONES = codec.packb({"actions": np.ones((4, 2), np.float32)})


def test_a_reply_to_nobody_is_never_taken_for_an_answer() -> None:
    """A frame right after the metadata, before any request: the first act refuses to
    pair its answer with it, and the frame is counted as a reply naming no request (as the
    act client counts them: unknown_replies), over every connection. Repro: it was not
    counted at all."""

    with Hostile(answering(unasked=ONES)) as server:

        async def main() -> None:
            link = OpenpiLink(server.url, FAST)
            await link.connect(deadline_s=DEADLINE_S)
            await await_until(lambda: link._conn and link._conn.recv_messages.frames, "frame")
            with pytest.raises(ConnectionLost, match="no request asked for"):
                await link.act({"x": 1}, DEADLINE_S)
            assert link.dropped_replies() == {"unknown": 1}
            assert link.state.as_dict()["unknown_replies"] == 1  # status shows it
            await link.connect(deadline_s=DEADLINE_S)  # the next connection sends one too
            await await_until(lambda: link._conn and link._conn.recv_messages.frames, "frame")
            with pytest.raises(ConnectionLost, match="no request asked for"):
                await link.act({"x": 1}, DEADLINE_S)
            assert link.dropped_replies() == {"unknown": 2}
            await link.close()

        run(main)


@pytest.mark.parametrize("extra", [False, True])
def test_a_server_gone_while_idle_is_noticed_with_its_reason(extra: bool) -> None:
    """Repro: a server that closed (or reset) the connection while no act was in flight
    left the link saying connected, in status too, until the next act: for ever when the
    robot is idle. With `extra`, a frame nobody asked for came before the close: counted
    (unknown_replies), though no act came after it."""

    async def script(peer: Peer) -> None:
        peer.send(b"\x80")
        await peer.request()
        peer.send(GOOD)
        if extra:
            peer.send(ONES)
        await asyncio.sleep(0)
        peer.close(1001, "going away")

    with Hostile(script) as server:

        async def main() -> None:
            link = OpenpiLink(server.url, FAST)
            await link.connect(deadline_s=DEADLINE_S)
            await link.act({"x": 1}, DEADLINE_S)
            await await_until(lambda: not link.connected, "the idle link noticed the close")
            assert "closed while idle (code 1001 'going away')" in link.state.last_error
            assert link.state.reconnecting_since is not None
            assert link.dropped_replies() == {"unknown": int(extra)}
            await link.close()

        run(main)


def test_pongs_never_sent_drop_the_connection_at_the_keepalive() -> None:
    """A server that takes the connection and then answers nothing, pings included: the
    link's keepalive (policy.openpi.keepalive_s, short here) drops it and says so."""

    async def script(peer: Peer) -> None:
        peer.answer_pings = False
        peer.send(b"\x80")
        await peer.hang()

    opts = FAST.model_copy(update={"keepalive_s": 0.2})
    with Hostile(script) as server:

        async def main() -> None:
            link = OpenpiLink(server.url, opts)
            await link.connect(deadline_s=DEADLINE_S)
            await await_until(lambda: not link.connected, "the keepalive dropped it")
            assert "keepalive ping timeout" in link.state.last_error
            assert server.peers[0].pings >= 1
            await link.close()

        run(main)


def test_a_trickling_healthz_never_keeps_a_thread() -> None:
    """Repro: a /healthz answer trickled a byte at a time outlived every connect timeout
    (http.client's bounds one read, not the answer), so each attempt left a thread and a
    socket behind for as long as the server kept trickling."""

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        while True:
            writer.write(b"a")
            await writer.drain()
            await asyncio.sleep(0.02)

    opts = FAST.model_copy(update={"connect_timeout_s": 0.3})
    with Hostile(answering(), healthz=trickle) as server:

        async def main() -> None:
            link = OpenpiLink(server.url, opts)
            with pytest.raises(ConnectionLost, match="no connection within"):
                await link.connect(deadline_s=1.0)
            assert "connect timeout" in link.state.last_error

        run(main)
        wait_until(lambda: server.open == 0, "every trickled /healthz cut off", timeout=10)
