"""robotd's byte-stream transport (robotd.stream): framing on real socket pairs, the
worker's StreamRouter against hostile peers, and the daemon's StreamDealer losing and
finding its worker again, all on real sockets."""

from __future__ import annotations

import os
import random
import select
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from serve_util import serving, start_serving

from robotd import framed
from robotd.link.client import PolicyClient, PolicyError
from robotd.link.stream_dealer import StreamDealer
from robotd.stream import endpoint as ep
from robotd.stream import router as router_mod
from robotd.stream.framing import FrameReader, FrameWriter, StreamBroken, StreamEnded, head
from robotd.stream.router import StreamRouter


def run(fn: Any) -> Any:
    return anyio.run(fn, backend_options={"use_uvloop": True})


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def _drain(reader: FrameReader, sock: socket.socket, want: int) -> list[list[bytearray]]:
    """Messages until `want` arrived (the writer side has written everything already)."""
    got: list[list[bytearray]] = []
    deadline = time.monotonic() + 20
    while len(got) < want:
        assert time.monotonic() < deadline, f"only {len(got)} of {want} messages arrived"
        got += reader.receive(sock)
    return got


# ---- framing --------------------------------------------------------------------------------


def test_messages_of_every_shape_round_trip(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    rng = np.random.default_rng(1)
    sizes = [[0], [1], [5, 0, 7], [70_000], [3, 200_000, 16_384, 16_383], [1] * 300]
    messages = [[rng.bytes(n) for n in frame_sizes] for frame_sizes in sizes]
    writer, reader = FrameWriter(), FrameReader(max_bytes=1 << 20)
    got: list[list[bytearray]] = []
    for m in messages:
        writer.queue(m)
    deadline = time.monotonic() + 20
    while writer.wants_write or len(got) < len(messages):  # the pair's buffer is small
        assert time.monotonic() < deadline
        writer.flush(a)
        got += reader.receive(b)
    assert [[bytes(f) for f in m] for m in got] == messages
    assert writer.pending_bytes == 0


def test_a_message_split_at_every_byte_is_put_back_together() -> None:
    body = [b"header", bytes(range(256)) * 100, b"", b"tail"]
    wire_bytes = head([len(f) for f in body]) + b"".join(body)
    # Every cut within the prefix (the count, then each length) and past it, every 97th.
    for cut in [*range(1, 64), *range(64, len(wire_bytes), 97)]:
        a, b = socket.socketpair()
        b.setblocking(False)
        reader = FrameReader(max_bytes=1 << 20)
        a.sendall(wire_bytes[:cut])
        first = _poll_some(reader, b)
        a.sendall(wire_bytes[cut:])
        rest = _drain(reader, b, 1 - len(first))
        assert [[bytes(f) for f in m] for m in first + rest] == [body]
        a.close()
        b.close()


def test_two_messages_read_a_byte_at_a_time_are_put_back_together() -> None:
    """Every state of the reader: the count, each length and each frame cut after each
    byte, then a second message after the first's last byte."""
    bodies = [[b"h" * 9, b"", bytes(range(200))], [b"second", b"x" * 3]]
    wire_bytes = b"".join(head([len(f) for f in m]) + b"".join(m) for m in bodies)
    a, b = socket.socketpair()
    b.setblocking(False)
    reader = FrameReader(max_bytes=1 << 20)
    got: list[list[bytearray]] = []
    for i in range(len(wire_bytes)):
        a.sendall(wire_bytes[i : i + 1])
        got += _read_one_byte(reader, b)
    assert [[bytes(f) for f in m] for m in got] == bodies
    a.close()
    b.close()


def _read_one_byte(reader: FrameReader, sock: socket.socket) -> list[list[bytearray]]:
    """What the reader hands out once the byte just sent has been read."""
    select.select([sock], [], [], 20)
    return reader.receive(sock)


def _poll_some(reader: FrameReader, sock: socket.socket) -> list[list[bytearray]]:
    out: list[list[bytearray]] = []
    for _ in range(3):  # what the first part holds (never a whole message before the cut)
        out += reader.receive(sock)
    return out


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (struct.pack("<I", 0), "a message of 0 frames"),
        (struct.pack("<I", framed.MAX_FRAMES + 1), f"{framed.MAX_FRAMES + 1} frames"),
        (struct.pack("<IQ", 1, 2_000_000), "2000000 bytes, over 1048576"),
        (struct.pack("<IQQ", 2, 1 << 63, 1 << 63), "over 1048576"),
    ],
)
def test_broken_prefixes_break_the_stream_by_name(
    pair: tuple[socket.socket, socket.socket], data: bytes, needle: str
) -> None:
    a, b = pair
    a.sendall(data)
    with pytest.raises(StreamBroken, match=needle):
        _drain(FrameReader(max_bytes=1 << 20), b, 1)


def test_the_peers_end_mid_message_breaks_the_stream(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.sendall(head([3, 10]) + b"abc" + b"12345")
    a.close()
    with pytest.raises(StreamBroken, match="closed the stream"):
        _drain(FrameReader(max_bytes=1 << 20), b, 1)


def test_a_peer_that_closes_with_our_bytes_unread_ended_the_stream(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """The kernel reports such a close as a reset (ECONNRESET): a peer gone, as at a
    daemon's clean stop with replies unread, not a stream whose framing broke."""
    a, b = pair
    b.sendall(head([5]) + b"reply")  # a never reads it
    a.close()
    with pytest.raises(StreamEnded, match="closed the stream"):
        _drain(FrameReader(max_bytes=1 << 20), b, 1)


def test_messages_before_the_end_are_handed_out_first(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.sendall(head([2]) + b"ok")
    a.close()
    reader = FrameReader(max_bytes=1 << 20)
    assert [bytes(f) for f in _drain(reader, b, 1)[0]] == [b"ok"]
    with pytest.raises(StreamBroken):
        reader.receive(b)


def test_random_bytes_only_ever_break_the_stream() -> None:
    rng = random.Random(7)
    for trial in range(200):
        a, b = socket.socketpair()
        b.setblocking(False)
        a.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 600))))
        a.close()
        reader = FrameReader(max_bytes=1 << 16)
        try:
            for _ in range(50):
                reader.receive(b)
        except StreamBroken:
            pass
        else:
            raise AssertionError(f"trial {trial}: the stream never ended")
        b.close()


# ---- the worker's end ---------------------------------------------------------------------


ECHO = """
class Echo:
    \"\"\"No contract: answers one row holding the observation's value.\"\"\"

    def infer(self, obs):
        return [[float(obs["v"]), 0.0]]
"""


@pytest.fixture
def short(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short directory (unix socket paths are limited to 107 bytes) holding the Echo
    policy's module, importable by a worker in this process."""
    path = Path(tempfile.mkdtemp(prefix="robotd-st-"))
    (path / "echo_policy.py").write_text(ECHO)
    monkeypatch.syspath_prepend(str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def stream_worker(short: Path) -> Iterator[str]:
    with serving("echo_policy:Echo", f"stream+ipc://{short}/w.sock") as bound:
        yield bound
    assert not (short / "w.sock").exists()


def _peer(endpoint: str) -> socket.socket:
    """A bare connection to the worker's stream+ipc socket, nothing of robotd's client in
    the way."""
    path = ep.ipc_file(endpoint)
    assert path is not None
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(path))
    return s


def _act(client: PolicyClient, step: int, v: float) -> Any:
    return client.act("S", step, [step], [{"v": v}])


def test_a_hostile_peer_is_closed_and_the_others_are_served(stream_worker: str) -> None:
    async def main() -> None:
        client = PolicyClient(stream_worker, timeout_s=20)
        await client.connect()
        for junk in (struct.pack("<I", 0), struct.pack("<IQ", 1, 1 << 40), b"\xff" * 64):
            bad = _peer(stream_worker)
            bad.sendall(junk)
            bad.settimeout(20)
            assert bad.recv(16) == b""  # closed by the worker, nothing answered
            bad.close()
            result = await _act(client, 1, 2.5)
            assert result.actions[0, 0] == 2.5
        await client.close()

    run(main)


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_frame_claimed_but_not_sent_costs_no_memory(stream_worker: str) -> None:
    """A peer's prefix may claim up to 1 GiB; memory is given only as bytes arrive."""
    async def main() -> None:
        client = PolicyClient(stream_worker, timeout_s=20)
        await client.connect()
        before = _rss_bytes()
        claims = []
        for _ in range(4):  # 4 x 768 MiB claimed, 1 kB each sent
            s = _peer(stream_worker)
            s.sendall(struct.pack("<IQ", 1, 768 << 20) + bytes(1000))
            claims.append(s)
        # The worker reads a peer's bytes in the pass that finds them, before later ones.
        assert (await _act(client, 1, 5.0)).actions[0, 0] == 5.0
        grown = _rss_bytes() - before
        assert grown < 64 << 20, f"the claims cost {grown >> 20} MiB"
        for s in claims:
            s.close()
        await client.close()

    run(main)


def test_peers_over_the_limit_are_refused_and_the_first_still_served(
    stream_worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(router_mod, "MAX_PEERS", 3)
    async def main() -> None:
        client = PolicyClient(stream_worker, timeout_s=20)
        await client.connect()  # peer 1
        extra = []
        for _ in range(2):  # peers 2 and 3
            s = _peer(stream_worker)
            extra.append(s)
        await _act(client, 1, 1.0)  # the worker has accepted them all by now
        over = _peer(stream_worker)  # accepted by the kernel, closed by the worker
        over.settimeout(20)
        assert over.recv(16) == b""
        assert (await _act(client, 2, 3.0)).actions[0, 0] == 3.0
        for s in [*extra, over]:
            s.close()
        await client.close()

    run(main)


def test_replies_to_a_peer_that_does_not_read_are_dropped_past_the_bound(
    stream_worker: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer that sends pings and reads none of the answers: what waits for it stays
    bounded (later replies are dropped and said so), others are served meanwhile, and
    once it reads again it is answered again."""
    monkeypatch.setattr(router_mod, "MAX_PENDING", 16 << 10)
    path = ep.ipc_file(stream_worker)
    assert path is not None

    def ping(rid: int) -> bytes:
        body = framed.pack({"id": rid, "cmd": "ping"})[0]
        return head([len(body)]) + body

    greedy = socket.socket(socket.AF_UNIX)
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    greedy.connect(str(path))
    greedy.settimeout(20)
    sent = 3000
    greedy.sendall(b"".join(ping(i) for i in range(1, sent + 1)))

    async def others_are_served() -> None:
        client = PolicyClient(stream_worker, timeout_s=20)
        await client.connect()
        assert (await _act(client, 1, 4.0)).actions[0, 0] == 4.0
        await client.close()

    run(others_are_served)
    # Now read: what was kept drains; a ping sent whenever the stream runs dry is answered
    # once the backlog is gone (one sent while it is full is dropped like the others).
    reader, seen, late = FrameReader(max_bytes=1 << 20), [], sent
    greedy.setblocking(False)
    deadline = time.monotonic() + 30
    while not seen or max(seen) <= sent:
        assert time.monotonic() < deadline, f"{len(seen)} replies, none to a late ping"
        if not select.select([greedy], [], [], 0.2)[0]:
            late += 1
            greedy.sendall(ping(late))
            continue
        seen += [framed.unpack(m)["id"] for m in reader.receive(greedy)]
    greedy.close()
    kept = [i for i in seen if i <= sent]
    assert 0 < len(kept) < sent, "every reply was kept: nothing bounds a slow reader"
    assert kept == sorted(kept)  # what was kept came in order
    assert "reads its replies too slowly" in caplog.text


def test_stream_router_binds_tcp_port_zero_and_names_the_port() -> None:
    r = StreamRouter("stream+tcp://127.0.0.1:0", max_message_bytes=1 << 20)
    bound = r.bind()
    try:
        port = int(bound.rsplit(":", 1)[1])
        assert bound.startswith("stream+tcp://127.0.0.1:") and port > 0
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
    finally:
        r.close()


@pytest.mark.parametrize(
    ("endpoint", "needle"),
    [
        ("stream+tcp://host", "want stream\\+tcp://HOST:PORT"),
        ("stream+tcp://h:70000", "out of range"),
        ("stream+tcp://*:5555", "'\\*' is for binding"),
        ("stream+ipc://", "no socket path"),
        ("stream+ipc:///" + "x" * 120, "over 107 bytes"),
        ("tcp://h:1", "not a stream endpoint"),
    ],
)
def test_bad_stream_endpoints_are_named(endpoint: str, needle: str) -> None:
    with pytest.raises(ep.EndpointError, match=needle):
        ep.parse(endpoint)


def test_a_bind_over_a_file_that_is_not_a_socket_is_refused(tmp_path: Path) -> None:
    precious = tmp_path / "data.txt"
    precious.write_text("keep me")
    with pytest.raises(OSError, match="not a socket"):
        StreamRouter(f"stream+ipc://{precious}", max_message_bytes=1024).bind()
    assert precious.read_text() == "keep me"


# ---- the daemon's end ---------------------------------------------------------------------


def test_the_client_finds_a_restarted_worker_again(short: Path) -> None:
    """The worker goes away for longer than a call's timeout and comes back on the same
    path: the call meanwhile times out (never hangs), the next one is answered."""
    endpoint = f"stream+ipc://{short}/w.sock"

    async def main() -> None:
        worker = start_serving("echo_policy:Echo", endpoint)
        client = PolicyClient(endpoint, timeout_s=20)
        await client.connect()
        assert (await _act(client, 1, 1.0)).actions[0, 0] == 1.0
        await anyio.to_thread.run_sync(worker.stop)
        with pytest.raises(TimeoutError):
            await client.act("S", 2, [2], [{"v": 2.0}], timeout_s=0.5)
        worker = start_serving("echo_policy:Echo", endpoint)
        with anyio.fail_after(30):
            while True:  # redialled within RECONNECT_S of the worker binding again
                try:
                    result = await client.act("S", 3, [3], [{"v": 3.0}], timeout_s=2)
                    break
                except TimeoutError:
                    continue
        assert result.actions[0, 0] == 3.0
        await client.close()
        await anyio.to_thread.run_sync(worker.stop)

    run(main)


def test_a_reply_over_the_limit_closes_the_connection_and_it_is_dialled_again() -> None:
    """A hostile server: its first reply claims a frame over the client's limit, so the
    client drops the connection (no allocation of what it claims) and dials again."""
    path = Path(f"/tmp/robotd-sh-{time.monotonic_ns()}.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)
    accepted: list[socket.socket] = []

    def hostile() -> None:
        server.settimeout(30)
        first, _ = server.accept()
        accepted.append(first)
        first.sendall(struct.pack("<IQ", 1, 1 << 30))
        second, _ = server.accept()  # the client came back
        accepted.append(second)
        second.sendall(head([2]) + b"hi")

    t = threading.Thread(target=hostile, daemon=True)
    t.start()
    got: list[list[bytes]] = []

    async def main() -> None:
        arrived = anyio.Event()

        def on_message(frames: list[Any]) -> None:
            got.append([bytes(f) for f in frames])
            arrived.set()

        dealer = StreamDealer(f"stream+ipc://{path}", on_message, max_message_bytes=1 << 20)
        dealer.open()
        with anyio.fail_after(30):
            await arrived.wait()
        assert dealer.connections == 2
        dealer.close()
        with pytest.raises(Exception, match="closed"):
            dealer.try_send([b"x"])

    try:
        run(main)
        t.join(30)
        assert got == [[b"hi"]]
    finally:
        for s in accepted:
            s.close()
        server.close()
        path.unlink(missing_ok=True)


def test_policy_error_when_the_client_is_closed_while_waiting_to_connect() -> None:
    async def main() -> None:
        client = PolicyClient("stream+ipc:///tmp/robotd-nobody-here.sock", timeout_s=30)

        async def close_soon() -> None:
            await anyio.wait_all_tasks_blocked()  # connect() waits for a worker
            await client.close()

        async with anyio.create_task_group() as tg:
            tg.start_soon(close_soon)
            with anyio.fail_after(20), pytest.raises(PolicyError, match="closed"):
                await client.connect()

    run(main)
