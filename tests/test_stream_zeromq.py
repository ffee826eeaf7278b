"""A stream endpoint and a ZeroMQ one mixed up say so: the stream reader tells a ZeroMQ
greeting (its ZMTP signature) at a stream's start, exactly and without holding more than
its 10 bytes; the daemon's stream client names a ZeroMQ worker, the worker's stream
endpoint names a ZeroMQ client (once, however often it redials), and the daemon's ZeroMQ
client names an endpoint that accepts a connection but sends no ZeroMQ greeting.

Real processes (`robotd serve`, `robotd run`) and sockets on loopback, on ports the
kernel picks; every wait is on a line or an event, with a generous deadline."""

from __future__ import annotations

import logging
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from robotd import wire
from robotd.link.peer import diagnose
from robotd.stream import zmtp
from robotd.stream.framing import FrameReader, SpeaksZeroMQ, StreamBroken, head
from robotd.stream.router import StreamRouter
from tests.copy_util import DEADLINE_S, wait_for
from tests.daemon_util import REPO, Daemon

LIBZMQ = bytes.fromhex("ff00000000000000017f")  # what libzmq 4.x sends first (both ends)
GREETINGS = [LIBZMQ, b"\xff" + bytes(8) + b"\x7f", b"\xff" + b"\xab" * 8 + b"\x7f"]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def _read_all(reader: FrameReader, sock: socket.socket, turns: int = 8) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    for _ in range(turns):
        out += [[bytes(f) for f in m] for m in reader.receive(sock)]
    return out


# ---- the reader ---------------------------------------------------------------------------


@pytest.mark.parametrize("greeting", GREETINGS)
def test_a_zmtp_greeting_at_the_start_is_told(
    pair: tuple[socket.socket, socket.socket], greeting: bytes
) -> None:
    a, b = pair
    a.sendall(greeting + b"\x03\x00NULL")  # and what ZMTP 3 sends after its signature
    with pytest.raises(SpeaksZeroMQ, match="speaks ZeroMQ"):
        _read_all(FrameReader(max_bytes=1 << 20), b)


@pytest.mark.parametrize("greeting", GREETINGS)
def test_a_greeting_that_comes_byte_by_byte_is_told_at_its_tenth(
    pair: tuple[socket.socket, socket.socket], greeting: bytes
) -> None:
    a, b = pair
    reader = FrameReader(max_bytes=1 << 20)
    for byte in greeting[:-1]:
        a.sendall(bytes([byte]))
        assert reader.receive(b) == []  # held, not judged (its count alone could be out of range)
    a.sendall(greeting[-1:])
    with pytest.raises(SpeaksZeroMQ):
        reader.receive(b)


@pytest.mark.parametrize("cut", [1, 3, 4, 9, 10, 11, 4096])
def test_a_message_of_255_frames_opens_with_0xff_and_is_no_greeting(
    pair: tuple[socket.socket, socket.socket], cut: int
) -> None:
    """Its count, 255, is 0xFF 00 00 00: byte 9 is in its first length, far from 0x7F."""
    a, b = pair
    frames = [bytes([i % 256]) * (i % 3) for i in range(255)]
    data = head([len(f) for f in frames]) + b"".join(frames)
    assert data[0] == 0xFF and zmtp.verdict(data) is False
    reader = FrameReader(max_bytes=1 << 20)
    got: list[list[bytes]] = []
    for start in range(0, len(data), cut):
        a.sendall(data[start : start + cut])
        got += _read_all(reader, b, 2)
    assert got == [frames]


def test_a_signature_after_the_first_message_is_no_greeting(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.sendall(head([2]) + b"ok" + LIBZMQ)
    a.close()
    reader = FrameReader(max_bytes=1 << 20)
    assert _read_all(reader, b, 1) == [[b"ok"]]
    with pytest.raises(StreamBroken) as broken:
        _read_all(reader, b)
    assert not isinstance(broken.value, SpeaksZeroMQ)


def test_the_verdict_needs_the_first_and_tenth_byte() -> None:
    assert zmtp.verdict(b"") is None
    assert zmtp.verdict(b"\x01") is False
    assert zmtp.verdict(b"\xff" * 9) is None
    assert zmtp.verdict(LIBZMQ) is True
    assert zmtp.verdict(LIBZMQ[:9] + b"\x00") is False
    # No robotd stream can open so: a first frame of >= 0x7F << 40 bytes, over any limit.
    assert struct.unpack_from("<Q", LIBZMQ + bytes(2), 4)[0] >= 0x7F << 40 > wire.MAX_MESSAGE_BYTES


def test_hostile_openings_only_ever_break_the_stream() -> None:
    """Openings near a greeting, cut anywhere: nothing but StreamBroken comes out, at most
    the signature's bytes are held while telling, and every stream ends."""
    rng = random.Random(23)
    for trial in range(400):
        body = bytearray(rng.randrange(256) for _ in range(rng.randrange(0, 80)))
        if rng.random() < 0.7:
            body[:0] = b"\xff"
        if rng.random() < 0.5 and len(body) >= 10:
            body[9] = rng.choice([0x7F, 0x7E, 0xFF])
        a, b = socket.socketpair()
        b.setblocking(False)
        reader = FrameReader(max_bytes=1 << 16)
        try:
            at = 0
            while at < len(body):
                step = rng.randrange(1, 12)
                a.sendall(body[at : at + step])
                at += step
                reader.receive(b)
                assert len(reader._opening or b"") < zmtp.SIGNATURE_SIZE
            a.close()
            for _ in range(50):
                reader.receive(b)
        except StreamBroken as why:
            told = isinstance(why, SpeaksZeroMQ)
            assert told == (len(body) >= 10 and body[0] == 0xFF and body[9] == 0x7F), trial
        else:
            raise AssertionError(f"trial {trial}: the stream never ended")
        finally:
            a.close()
            b.close()


# ---- the worker's stream endpoint and a ZeroMQ client -------------------------------------


def test_the_stream_endpoint_closes_a_zeromq_client_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = StreamRouter("stream+tcp://127.0.0.1:0", max_message_bytes=1 << 20)
    bound = router.bind()
    port = bound.rpartition(":")[2]
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    monitor = dealer.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    caplog.set_level(logging.WARNING, "robotd.worker")
    connected = handshakes = 0
    deadline = time.monotonic() + DEADLINE_S
    try:
        while connected < 4:  # it redials every 100 ms; each is closed at its greeting
            assert time.monotonic() < deadline, f"{connected} connections"
            poller = zmq.Poller()
            poller.register(monitor, zmq.POLLIN)
            for fd, flags in router.fds().items():
                poller.register(fd, flags)
            ready = dict(poller.poll(1000))
            if monitor in ready:
                event = recv_monitor_message(monitor)["event"]
                connected += event == zmq.EVENT_CONNECTED
                handshakes += event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            assert router.receive(ready) == []
    finally:
        dealer.disable_monitor()
        monitor.close()
        dealer.close()
        ctx.term()
        router.close()
    lines = [r.getMessage() for r in caplog.records if "ZeroMQ client" in r.getMessage()]
    assert handshakes == 0
    assert len(lines) == 1, lines  # once a minute per host, not once a connection
    said = re.escape(
        f"connected to the stream endpoint {bound}: connect with {bound} (robotd's stream "
        f"framing), or serve the worker on tcp://127.0.0.1:{port} for ZeroMQ; closed it"
    )
    assert re.fullmatch(rf"a ZeroMQ client from 127\.0\.0\.1:\d+ {said}", lines[0]), lines


# ---- the daemon's ZeroMQ client: what answers where ZeroMQ was expected --------------------


def _probe(endpoint: str) -> str:
    return anyio.run(diagnose, endpoint, "policy.worker").text


def test_a_zeromq_socket_is_no_problem() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        assert _probe(f"tcp://127.0.0.1:{port}") == ""
    finally:
        router.close()
        ctx.term()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (None, r"sent no ZeroMQ greeting within 0\.5 s"),
        (b"", "closed it with no ZeroMQ greeting"),
        (b"HTTP/1.1 400", r"answered with bytes that are no ZeroMQ greeting \(48 54 54"),
    ],
)
def test_a_listener_that_sends_no_greeting_is_named(answer: bytes | None, said: str) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def serve() -> None:  # one connection: answer it so, then wait for the hang-up
            conn, _ = listener.accept()
            with conn:
                if answer is not None:
                    conn.sendall(answer)
                    conn.shutdown(socket.SHUT_WR)
                conn.settimeout(DEADLINE_S)
                conn.recv(1)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        why = _probe(f"tcp://127.0.0.1:{port}")
        server.join(DEADLINE_S)
    assert re.search(f"the endpoint accepted a TCP connection but {said}", why), why
    want = f"(a worker on robotd's stream framing? connect with stream+tcp://127.0.0.1:{port})"
    assert why.endswith(want), why


# ---- end to end: a daemon and a worker of the other kind ----------------------------------


class Serve:
    """`robotd serve robotd.demo:DotFollower --bind BIND`, its output in a file."""

    def __init__(self, bind: str, tmp: Path) -> None:
        self.out = tmp / "serve.txt"
        argv = [sys.executable, "-m", "robotd", "serve", "robotd.demo:DotFollower"]
        with self.out.open("w") as sink:
            self.proc = subprocess.Popen(
                [*argv, "--bind", bind], cwd=REPO, stdout=sink, stderr=subprocess.STDOUT
            )
        found = wait_for(
            lambda: re.search(r"listening on (\S+)", self.text()) or self.proc.poll() is not None,
            "the worker to listen",
        )
        assert self.proc.poll() is None, self.text()
        self.endpoint = found.group(1)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory for ipc sockets (their paths must stay short)."""
    with tempfile.TemporaryDirectory(prefix="robotd-zq-") as tmp:
        yield Path(tmp)


def _binds(kind: str, scheme: str, short: Path) -> str:
    return f"{kind}tcp://127.0.0.1:0" if scheme == "tcp" else f"{kind}ipc://{short}/w.sock"


# each mix-up end to end once, over tcp for one and ipc for the other (the detection is the
# same code on both: the reader and probe tests above take each transport apart)
def test_a_stream_daemon_names_a_zeromq_worker(tmp_path: Path, short_dir: Path) -> None:
    worker = Serve(_binds("", "tcp", short_dir), tmp_path)
    try:
        zeromq = worker.endpoint
        stream = "stream+" + zeromq
        d = Daemon(tmp_path, "--worker", stream, "--duration", "3")
        said = re.escape(
            f"the peer at {stream} speaks ZeroMQ (connect with {zeromq}, or serve the worker "
            f"on {stream}): not robotd's stream framing"
        )
        d.wait_line(rf"WARNING robotd\.link: act connection to .*{said}; reconnecting", 60)
        d.wait_line(rf"no answer yet \({said}\)", 60)
        d.wait_line(rf"did not answer hello within 3 s: {said}$", 60)
        assert d.wait_exit(timeout=90) == 2
        log = "".join(d.wait_eof())
        # However often it redialled, the line was said once in its 10 s.
        assert len(re.findall(rf"act connection to .*{said}; reconnecting\n", log)) == 1, log
    finally:
        worker.stop()


def test_a_zeromq_daemon_and_a_stream_worker_name_each_other(
    tmp_path: Path, short_dir: Path
) -> None:
    worker = Serve(_binds("stream+", "ipc", short_dir), tmp_path)
    try:
        stream = worker.endpoint
        zeromq = stream.removeprefix("stream+")
        said = re.escape(
            "the endpoint accepted a connection but sent no ZeroMQ greeting within 0.5 s: not a "
            f"ZeroMQ socket (a worker on robotd's stream framing? connect with {stream})"
        )
        d = Daemon(tmp_path, "--worker", zeromq, "--duration", "3")
        d.wait_line(rf"no answer yet \({said}\)", 60)
        d.wait_line(rf"did not answer hello within 3 s: {said}$", 60)
        assert d.wait_exit(timeout=90) == 2
        d.wait_eof()
        told = "a ZeroMQ client " + re.escape(
            f"connected to the stream endpoint {stream}: connect with {stream} (robotd's "
            f"stream framing), or serve the worker on {zeromq} for ZeroMQ; closed it"
        )
        wait_for(lambda: re.search(told, worker.text()), "the worker's line")
        # Its DEALER redialled every 100 ms for seconds: one line for them all.
        assert len(re.findall(told, worker.text())) == 1, worker.text()
    finally:
        worker.stop()
