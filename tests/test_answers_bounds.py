"""What an answer may be, held on every side with real processes and sockets: the worker
refuses a runaway answer (rows, columns) and bool or integer rows before anything is sent,
naming the shape or dtype and the bound; the daemon names its own bound for it and the
robot holds while the loop goes on; the daemon's act link takes no reply larger than an
answer can be (a hostile worker cannot make it take in a GiB), and refuses bool or integer
rows from a worker that sends them anyway."""

from __future__ import annotations

import logging
import os
import socket
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import zmq

from robotd import framed, wire
from robotd.contract import MAX_ANSWER_COLUMNS, MAX_ANSWER_ROWS
from robotd.lane.messages import MAX_JOINTS, MAX_ROWS
from robotd.link.client import MAX_REPLY_BYTES, PolicyClient, PolicyError
from robotd.stream.framing import head
from robotd.worker.policy_host import MAX_ERROR_TEXT
from tests.copy_util import ROOT, TESTS, Worker
from tests.daemon_util import Daemon

POLICIES = "test_answers_policies"


def test_the_worker_bounds_are_the_robot_sides_ceilings() -> None:
    """The worker refuses only what no robotd daemon could play: its bounds are the lane's,
    and policy.max_chunk_rows cannot be set above them."""
    from robotd.config.policy import PolicyConfig

    assert (MAX_ANSWER_ROWS, MAX_ANSWER_COLUMNS) == (MAX_ROWS, MAX_JOINTS)
    ceiling = [
        m.le for m in PolicyConfig.model_fields["max_chunk_rows"].metadata if hasattr(m, "le")
    ]
    assert ceiling == [MAX_ANSWER_ROWS]


# ---- the worker: a real `robotd serve` -------------------------------------------------------


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    w = Worker(f"{POLICIES}:Shaped", "--copies", "1")
    try:
        w.wait_ready(1)
        yield w
    finally:
        w.stop()


def _act(worker: Worker, episode: str, step: int, answer: str) -> dict[str, Any]:
    return worker.client.recv(worker.client.act(episode, step, answer=answer))


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (
            "wide",
            "shape (16, 3000000) is over what any robot plays (384 MB; at most 4096 rows "
            "of at most 64 joints",
        ),
        ("tall", "shape (5000, 3) is over what any robot plays"),
    ],
)
def test_a_runaway_answer_is_refused_by_the_worker_naming_its_shape(
    worker: Worker, answer: str, said: str
) -> None:
    reply = _act(worker, f"W-{answer}", 0, answer)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_actions", reply
    assert said in reply["error"]["message"]
    assert len(wire.packb(reply)) < 1000  # a small, clear error: not the answer's bytes
    assert _act(worker, f"W-{answer}", 1, "good")["ok"] is True  # the copy goes on


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ("bool", "dtype bool: a mask is never a joint target"),
        ("bool_list", "dtype bool: a mask is never a joint target"),
        ("int", "dtype int64: integers are no joint targets"),
        ("uint8", "dtype uint8: integers are no joint targets"),
    ],
)
def test_bool_and_integer_rows_are_refused_by_the_worker(
    worker: Worker, answer: str, said: str
) -> None:
    reply = _act(worker, f"D-{answer}", 0, answer)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_actions", reply
    assert said in reply["error"]["message"] and "return floats" in reply["error"]["message"]


def test_a_list_of_numbers_is_read_as_floats(worker: Worker) -> None:
    reply = _act(worker, "L", 0, "int_list")
    assert reply["ok"] is True, reply
    rows = reply["result"]["actions"]
    assert rows.dtype == np.float64 and rows.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]


def test_an_exception_text_is_cut_before_it_travels(worker: Worker) -> None:
    reply = _act(worker, "X", 0, "raise_long")
    assert reply["error"]["code"] == "policy_error"
    message = reply["error"]["message"]
    assert message.endswith("... (10000000 characters)") and len(message) < MAX_ERROR_TEXT + 100


def test_episode_steps_counts_the_acts_answered(worker: Worker) -> None:
    """Episode.steps (docs/contract.md): acts whose answer was accepted, not control steps
    and not an act that raised or was refused."""
    seen = [_act(worker, "S", 0, "steps")["result"]["actions"][0, 0]]
    assert _act(worker, "S", 3, "raise")["error"]["code"] == "policy_error"
    assert _act(worker, "S", 4, "bool")["error"]["code"] == "bad_actions"
    seen.append(_act(worker, "S", 9, "steps")["result"]["actions"][0, 0])
    assert seen == [0.0, 1.0]
    doc = (ROOT / "docs/contract.md").read_text()
    assert "`steps` answered so far" not in doc and "the acts of the episode answered" in doc


# ---- the daemon: its local worker serving the walkthrough's policies -------------------------


def _daemon(tmp: Path, policy: str) -> Daemon:
    path = os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return Daemon(
        tmp,
        "--set",
        f'policy.serve="{POLICIES}:{policy}"',
        "--set",
        "policy.args={}",
        env={"PYTHONPATH": path},
    )


@pytest.mark.parametrize(
    ("policy", "said"),
    [
        (
            "Wide",
            r"chunk refused: 3000000 columns, but this robot has 3 joints \(the worker's "
            r"refusal: answer: shape \(16, 3000000\) is over what any robot plays \(384 MB",
        ),
        ("Masked", r"act failed: PolicyError: bad_actions: answer: dtype bool: a mask is never"),
    ],
)
def test_the_robot_holds_and_the_loop_goes_on(tmp_path: Path, policy: str, said: str) -> None:
    """At the default heartbeat: the refusal is small and at once, so the worker is never
    taken for gone and the episode is not reset; every act is refused, none plays."""
    d = _daemon(tmp_path, policy)
    for _ in range(3):  # asked again and again: the loop ticks on, holding
        d.wait_line(r"robotd\.link: ask \d+: " + said, timeout=60)
    d.signal()
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    s = d.result()
    assert s["episode_resets"] == 0 and s["bad_messages"] == 0 and s["reconnects"] == 0
    assert s["chunks"] == 0 and s["act_failures"] >= 3 and s["holds"] > 0
    assert not any("no heartbeat" in line for line in d.log)


# ---- the daemon's act link against a hostile worker -----------------------------------------


class _Hostile:
    """A worker's act endpoint in a thread, over ZeroMQ (a ROUTER) or a byte stream (a Unix
    listener, robotd's framing by hand): hello is answered well, every act with
    `act(request)`'s rows. `cut` is set when a reply could not be written (the peer closed
    the connection under it)."""

    def __init__(self, endpoint: str, act: Callable[[dict[str, Any]], np.ndarray]) -> None:
        self.endpoint, self.act = endpoint, act
        self.cut = threading.Event()
        self.stop = threading.Event()
        self.stream = endpoint.startswith("stream+ipc://")
        if self.stream:
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(endpoint.removeprefix("stream+ipc://"))
            self.listener.listen()
            self.listener.settimeout(0.05)
        else:
            self.ctx = zmq.Context()
            self.sock = self.ctx.socket(zmq.ROUTER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.bind(endpoint)
        self.thread = threading.Thread(target=self._serve if self.stream else self._route)
        self.thread.start()

    def reply(self, request: dict[str, Any]) -> bytes:
        rid = request["id"]
        if request["cmd"] == "hello":
            result: dict[str, Any] = {
                "protocol": 1,
                "contract": {"observations": None, "actions": None},
                "endpoints": {"observe": None},
                "policy": "hostile:P",
            }
        else:
            result = {
                "actions": self.act(request),
                "timing": {"infer_ms": 1.0, "queue_ms": 0.0},
                "step": request["step"],
                "episode": request["episode"],
            }
        return wire.packb({"id": rid, "ok": True, "result": result})

    def _route(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while not self.stop.is_set():
                ready = dict(poller.poll(20))
                if monitor in ready and recv_monitor_message(monitor)["event"]:
                    self.cut.set()  # the client dropped the connection
                if self.sock in ready:
                    route, body = self.sock.recv_multipart()
                    self.sock.send_multipart([route, self.reply(wire.unpackb(body))])
        finally:
            self.sock.disable_monitor()
            monitor.close()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                self._converse(conn)

    def _converse(self, conn: socket.socket) -> None:
        conn.settimeout(0.05)
        while not self.stop.is_set():
            try:
                request = wire.unpackb(_read_message(conn))
            except TimeoutError:
                continue
            except (ConnectionError, EOFError):
                return
            body = self.reply(request)
            try:
                conn.settimeout(None)
                conn.sendall(head([len(body)]) + body)
            except OSError:  # the client hung up on it
                self.cut.set()
                return
            finally:
                conn.settimeout(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        if self.stream:
            self.listener.close()
        else:
            self.sock.close()
            self.ctx.term()


def _read_message(conn: socket.socket) -> bytes:
    """One message of robotd's stream framing, all its frames joined (requests here are one
    frame). TimeoutError before its first byte; EOFError when the peer closed."""
    (count,) = struct.unpack("<I", _read(conn, 4, first=True))
    lengths = struct.unpack(f"<{count}Q", _read(conn, 8 * count))
    return b"".join(_read(conn, n) for n in lengths)


def _read(conn: socket.socket, n: int, first: bool = False) -> bytes:
    got = b""
    while len(got) < n:
        try:
            more = conn.recv(n - len(got))
        except TimeoutError:
            if first and not got:
                raise
            continue
        if not more:
            raise EOFError
        got += more
    return got


@pytest.fixture(params=["stream+ipc", "ipc"])
def scheme(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rbt-a-") as tmp:  # ipc paths must stay short
        yield Path(tmp)


def test_a_reply_larger_than_any_answer_is_not_taken_in(
    scheme: str, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """24 MB of rows (over the 18 MiB a reply may be, far under the 1 GiB a request may):
    the connection is closed on it (a byte stream: at its prefix, before its bytes) and the
    act gets nothing. A byte stream dials again and its next act is answered; a ZeroMQ
    socket does not dial again after a protocol error (the daemon's heartbeat then finds the
    worker gone, and it connects a new client, as here)."""
    big = np.zeros((1_000_000, 3))
    assert big.nbytes > MAX_REPLY_BYTES
    hostile = _Hostile(
        f"{scheme}://{short_dir}/w.sock", lambda req: big if req["step"] == 0 else np.ones((2, 3))
    )

    async def main() -> None:
        client = PolicyClient(hostile.endpoint, timeout_s=10)
        try:
            await client.connect()
            # a byte stream fails the act as it drops the connection; ZeroMQ times it out
            with pytest.raises(PolicyError if hostile.stream else TimeoutError) as lost:
                await client.act("E", 0, [0], [{}], timeout_s=3)
            if hostile.stream:
                assert lost.value.code == "connection_lost", lost.value
                assert "a message of 24000123 bytes, over 18874368" in lost.value.message
            assert hostile.cut.wait(10)  # the client hung up on it (before it closed here)
            if not hostile.stream:
                await client.close()
                client = PolicyClient(hostile.endpoint, timeout_s=10)
                await client.connect()
            result = await client.act("E", 1, [1], [{}])
            assert result.actions.shape == (2, 3)
        finally:
            await client.close()

    try:
        with caplog.at_level(logging.INFO, logger="robotd.link"):
            anyio.run(main, backend_options={"use_uvloop": True})
    finally:
        hostile.close()
    if hostile.stream:  # at the prefix: the message's bytes were never read
        assert f"over {MAX_REPLY_BYTES}" in caplog.text


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        (np.ones((2, 3), dtype=bool), "dtype bool: a mask is never a joint target"),
        (np.zeros((2, 3), dtype=np.int64), "dtype int64: integers are no joint targets"),
    ],
)
def test_bool_or_integer_rows_from_a_worker_are_a_bad_reply(
    short_dir: Path, rows: np.ndarray, said: str
) -> None:
    hostile = _Hostile(f"ipc://{short_dir}/w.sock", lambda req: rows)

    async def main() -> None:
        client = PolicyClient(hostile.endpoint, timeout_s=10)
        try:
            await client.connect()
            with pytest.raises(PolicyError) as info:
                await client.act("E", 0, [0], [{}])
            assert info.value.code == "bad_reply" and said in info.value.message
        finally:
            await client.close()

    try:
        anyio.run(main, backend_options={"use_uvloop": True})
    finally:
        hostile.close()


def test_framed_replies_stay_within_the_bound() -> None:
    """The bound holds the largest legitimate answer with its header, framed or not."""
    rows = np.zeros((MAX_ANSWER_ROWS, MAX_ANSWER_COLUMNS))
    reply = {"id": 1, "ok": True, "result": {"actions": rows, "step": 0, "episode": "e" * 256}}
    assert len(wire.packb(reply)) < MAX_REPLY_BYTES
    assert sum(len(memoryview(f)) for f in framed.pack(reply)) < MAX_REPLY_BYTES


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        (np.ones((2, 3), dtype=bool), "dtype bool: a mask is never a joint target"),
        (np.zeros((2, 3), dtype=np.int32), "dtype int32: integers are no joint targets"),
    ],
)
def test_an_openpi_reply_of_bool_or_integer_rows_is_refused(rows: np.ndarray, said: str) -> None:
    """The openpi link holds a server's reply to the same rule (its lists of numbers, which
    carry no dtype, are still read as floats)."""
    from robotd.link.openpi.errors import BadReply
    from robotd.link.openpi.options import ActionsMap
    from robotd.link.openpi.request import parse_reply

    with pytest.raises(BadReply, match=said):
        parse_reply(ActionsMap(), {"actions": rows}, 3)
    listed = parse_reply(ActionsMap(), {"actions": [[0, 1, 0]]}, 3).rows
    assert listed.dtype == np.float64 and listed.tolist() == [[0.0, 1.0, 0.0]]
