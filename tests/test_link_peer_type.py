"""Why a ZeroMQ endpoint does not answer hello, told by looking at what is there
(robotd.link.peer.diagnose): each ZeroMQ socket type and security mechanism a user may
have put there by mistake, real pyzmq sockets on loopback and ipc; raw listeners that
greet and then stall, close or flood; the peer's application never sees a message, the
probe is bounded in time and leaves no descriptor open; and a real daemon pointed at a
PUB socket warns at once and names it when it gives up.

Real sockets on ports the kernel picks and ipc files in a temporary directory; every wait
is on an event with a generous deadline (tests.copy_util.DEADLINE_S)."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
import zmq

from robotd.link.peer import CONNECT_WAIT_S, GREETING_WAIT_S, Diagnosis, diagnose
from robotd.stream.zmtp_peer import GREETING_REST, GREETING_START, MAX_PEER_BYTES, ready_command
from tests.copy_util import DEADLINE_S
from tests.daemon_util import Daemon

SIGNATURE = bytes.fromhex("ff00000000000000017f")
ASK_PORT = "is policy.worker the right port?"
NOT_ROUTER = "a robotd worker is a ROUTER (`robotd serve`)"


def _diagnose(endpoint: str, source: str = "policy.worker") -> Diagnosis:
    return anyio.run(diagnose, endpoint, source)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory for ipc sockets (their paths must stay short)."""
    with tempfile.TemporaryDirectory(prefix="robotd-pt-") as tmp:
        yield Path(tmp)


def _bound(
    ctx: zmq.Context, kind: int, where: str, setup: Callable[[zmq.Socket], None] = lambda s: None
) -> tuple[zmq.Socket, str]:
    """A socket of `kind` bound on a loopback port ("tcp") or at the ipc path `where`."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    setup(sock)
    if where == "tcp":
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        return sock, f"tcp://127.0.0.1:{port}"
    sock.bind(f"ipc://{where}")
    return sock, f"ipc://{where}"


TYPES = ["PUB", "SUB", "PUSH", "PULL", "REQ", "REP", "DEALER", "PAIR", "XPUB", "XSUB"]


@pytest.mark.parametrize("name", TYPES)
def test_a_socket_of_another_type_is_named_over_tcp(ctx: zmq.Context, name: str) -> None:
    sock, endpoint = _bound(ctx, getattr(zmq, name), "tcp")
    told = _diagnose(endpoint)
    assert told.text == f"the endpoint is a ZeroMQ {name} socket: {NOT_ROUTER}; {ASK_PORT}"
    assert told.not_worker
    sock.close()


@pytest.mark.parametrize("name", ["PUB", "REQ"])
def test_a_socket_of_another_type_is_named_over_ipc(
    ctx: zmq.Context, short_dir: Path, name: str
) -> None:
    sock, endpoint = _bound(ctx, getattr(zmq, name), str(short_dir / "w.sock"))
    told = _diagnose(endpoint, "--worker")
    want = (
        f"the endpoint is a ZeroMQ {name} socket: {NOT_ROUTER}; is --worker the right socket file?"
    )
    assert told == Diagnosis(want, not_worker=True)
    sock.close()


def _curve(sock: zmq.Socket) -> None:
    _, secret = zmq.curve_keypair()
    sock.curve_server = True
    sock.curve_secretkey = secret


def _plain(sock: zmq.Socket) -> None:
    sock.plain_server = True


@pytest.mark.skipif(not zmq.has("curve"), reason="this libzmq was built without CURVE")
@pytest.mark.parametrize(("mechanism", "setup"), [("CURVE", _curve), ("PLAIN", _plain)])
def test_a_socket_that_asks_for_security_is_named(
    ctx: zmq.Context, mechanism: str, setup: Callable[[zmq.Socket], None]
) -> None:
    sock, endpoint = _bound(ctx, zmq.ROUTER, "tcp", setup)
    told = _diagnose(endpoint)
    assert told.text == (
        f"the endpoint is a ZeroMQ socket that asks for {mechanism} security, which the policy "
        f"link does not speak (it speaks NULL: none); {ASK_PORT}"
    )
    assert told.not_worker
    sock.close()


def test_a_router_is_no_problem_and_its_application_sees_nothing(ctx: zmq.Context) -> None:
    router, endpoint = _bound(ctx, zmq.ROUTER, "tcp")
    for _ in range(3):
        assert _diagnose(endpoint) == Diagnosis("")
    assert router.poll(200) == 0  # no message, no peer: the probe never sent its READY
    dealer = ctx.socket(zmq.DEALER)  # and the socket serves a real client after it
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send(b"hello")
    assert router.poll(int(DEADLINE_S * 1000)) and router.recv_multipart()[1] == b"hello"
    dealer.close()
    router.close()


@pytest.mark.parametrize("name", ["PULL", "SUB", "REP", "PAIR"])
def test_the_peers_application_is_handed_no_message(ctx: zmq.Context, name: str) -> None:
    sock, endpoint = _bound(ctx, getattr(zmq, name), "tcp")
    if name == "SUB":
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    assert _diagnose(endpoint).not_worker
    assert sock.poll(200) == 0  # no message frame was ever sent
    sock.close()


class RawPeer:
    """One raw listener on loopback that answers each connection with `answer(conn)`, then
    waits for the probe to hang up; records what the probe sent."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.answer = answer
        self.got = b""
        self.hung_up = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(DEADLINE_S)
            try:
                self.answer(conn)
                while more := conn.recv(4096):
                    self.got += more
            except OSError:
                pass
        self.hung_up.set()

    def close(self) -> None:
        self.listener.close()
        self.thread.join(DEADLINE_S)


def _greeting_then(rest: bytes) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(SIGNATURE + b"\x03" + rest)

    return answer


def _flood(conn: socket.socket) -> None:
    greeting = SIGNATURE + b"\x03\x01" + b"NULL".ljust(20, b"\0") + bytes(32)
    conn.sendall(greeting + b"\x06" + b"\xff" * 8 + b"\x05READY")  # a READY of 2^64 bytes
    try:
        for _ in range(256):  # 16 MiB unasked for: the probe reads a few hundred bytes
            conn.sendall(b"z" * 65536)
    except OSError:  # it hung up, as it should
        pass


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (_greeting_then(b""), "went quiet for 0.5 s before the rest of its greeting"),
        (
            _greeting_then(b"\x01" + b"NULL".ljust(20, b"\0") + bytes(32)),
            "went quiet for 0.5 s before its READY",
        ),
        (_flood, "sent a READY over 320 bytes with no Socket-Type in them"),
    ],
)
def test_a_zeromq_looking_peer_that_stalls_or_floods_is_bounded_and_named(
    answer: Callable[[socket.socket], None], said: str
) -> None:
    peer = RawPeer(answer)
    try:
        started = time.monotonic()
        told = _diagnose(peer.endpoint)
        took = time.monotonic() - started
        assert peer.hung_up.wait(DEADLINE_S)  # the probe closed its connection
    finally:
        peer.close()
    assert told.text.endswith(f"but {said}") and not told.not_worker, told
    # each stage waits GREETING_WAIT_S at most: three stages, with room for a loaded machine
    assert took < CONNECT_WAIT_S + 3 * GREETING_WAIT_S + DEADLINE_S
    # read-only: only its own greeting and (for a peer that waits for it) a READY went out
    assert peer.got[:64] == GREETING_START + GREETING_REST or len(peer.got) <= 64
    assert peer.got[64:] in (b"", ready_command())  # never a message frame


def test_the_probe_reads_no_more_than_its_bound_from_a_flooding_peer() -> None:
    reads: list[int] = []
    original = asyncio.StreamReader.read

    async def counted(self: asyncio.StreamReader, n: int = -1) -> bytes:
        data = await original(self, n)
        reads.append(len(data))
        return data

    peer = RawPeer(_flood)
    try:
        asyncio.StreamReader.read = counted  # type: ignore[method-assign]
        try:
            _diagnose(peer.endpoint)
        finally:
            asyncio.StreamReader.read = original  # type: ignore[method-assign]
    finally:
        peer.close()
    assert 0 < sum(reads) <= MAX_PEER_BYTES


def _open_fds() -> dict[str, str]:
    """The process's open descriptors and what each one names."""
    named: dict[str, str] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            named[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return named


def test_no_descriptor_is_left_open_on_any_path(ctx: zmq.Context, short_dir: Path) -> None:
    pub, pub_at = _bound(ctx, zmq.PUB, "tcp")
    router, router_at = _bound(ctx, zmq.ROUTER, "tcp")
    with socket.socket() as refused:
        refused.bind(("127.0.0.1", 0))  # bound, never listening: refused at once
        refused_at = f"tcp://127.0.0.1:{refused.getsockname()[1]}"
        endpoints = [pub_at, router_at, refused_at, f"ipc://{short_dir}/none.sock"]
        for endpoint in endpoints:  # warm up whatever the event loop opens once
            _diagnose(endpoint)
        gc.collect()  # an earlier test's garbage must not close its descriptors mid-count
        before = _open_fds()
        for _ in range(5):
            for endpoint in endpoints:
                _diagnose(endpoint)
        # only new descriptors are a leak: the process may close some of its own meanwhile
        opened = {fd: name for fd, name in _open_fds().items() if before.get(fd) != name}
        assert not opened, opened
    pub.close()
    router.close()


def test_no_listener_and_no_file_are_said_plainly(short_dir: Path) -> None:
    with socket.socket() as refused:
        refused.bind(("127.0.0.1", 0))
        assert _diagnose(f"tcp://127.0.0.1:{refused.getsockname()[1]}") == Diagnosis(
            "connection refused"
        )
    path = short_dir / "gone.sock"
    assert _diagnose(f"ipc://{path}") == Diagnosis(f"no socket file {path}")
    assert _diagnose("inproc://x") == Diagnosis("")


def test_a_daemon_pointed_at_a_pub_socket_warns_at_once_and_names_it(
    tmp_path: Path, ctx: zmq.Context
) -> None:
    pub, endpoint = _bound(ctx, zmq.PUB, "tcp")
    try:
        d = Daemon(tmp_path, "--worker", endpoint, "--duration", "3")
        said = re.escape(
            f"the endpoint is a ZeroMQ PUB socket: {NOT_ROUTER}; is --worker the right port?"
        )
        d.wait_line(rf"WARNING robotd\.link: .*no answer yet \({said}\): waiting up to 3 s", 60)
        d.wait_line(rf"did not answer hello within 3 s: {said}$", 60)
        assert d.wait_exit(timeout=90) == 2
        d.wait_eof()
    finally:
        pub.close()
