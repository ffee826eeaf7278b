"""A real `robotd serve` in a child process, with its copies of the policy in theirs, and a
bare DEALER that pipelines requests to it (for tests/test_copies.py)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from robotd import wire
from robotd.stream.framing import FrameReader, StreamBroken, head

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
DEADLINE_S = 60.0  # generous: a loaded 2-core machine starts Python processes slowly


def wait_for(predicate: Any, what: str, timeout: float = DEADLINE_S, every: float = 0.02) -> Any:
    """Poll `predicate` until it returns something truthy; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


class Client:
    """A DEALER on a worker's act socket (or, for stream+ipc://, a plain Unix socket
    framed by hand, dialled again whenever the worker has gone); replies matched by id."""

    def __init__(self, endpoint: str) -> None:
        self.rid = 0
        self.replies: dict[Any, dict[str, Any]] = {}
        self.path = endpoint.removeprefix("stream+ipc://") if endpoint.startswith("stream+") else ""
        self.raw: socket.socket | None = None
        if self.path:
            return
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, msg: dict[str, Any]) -> int:
        self.rid += 1
        self.send_raw(wire.packb({"id": self.rid, **msg}))
        return self.rid

    def send_raw(self, body: bytes) -> None:
        if not self.path:
            self.sock.send(body)
            return
        # As a DEALER queues a message until its peer is there: dial until the worker is.
        raw = wait_for(self._dial, f"the worker at {self.path} to listen")
        try:
            raw.sendall(head([len(body)]) + body)
        except OSError:  # the worker went: as a DEALER, the message is lost; dial again
            self._hang_up()

    def recv(self, rid: Any, timeout: float = DEADLINE_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while rid not in self.replies:
            left = deadline - time.monotonic()
            assert left > 0, f"no reply to {rid}"
            for body in self._receive(left):
                reply = wire.unpackb(body)
                self.replies[reply.get("id")] = reply
        return self.replies.pop(rid)

    def _receive(self, left: float) -> list[Any]:
        if not self.path:
            assert self.sock.poll(int(left * 1e3) + 1), "no reply"
            return [self.sock.recv()]
        raw = self.raw
        if raw is None:  # the request went down with its connection: no reply will come
            time.sleep(min(left, 0.05))
            return []
        if not select.select([raw], [], [], left)[0]:
            return []
        try:
            return [frames[0] for frames in self._reader.receive(_NoWait(raw))]
        except StreamBroken:
            self._hang_up()
            return []

    def _dial(self) -> socket.socket | None:
        if self.raw is None:
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                raw.connect(self.path)
            except OSError:
                raw.close()
                return None
            self.raw, self._reader = raw, FrameReader(wire.MAX_MESSAGE_BYTES)
        return self.raw

    def _hang_up(self) -> None:
        if self.raw is not None:
            self.raw.close()
            self.raw = None

    def request(self, msg: dict[str, Any], timeout: float = DEADLINE_S) -> dict[str, Any]:
        return self.recv(self.send(msg), timeout)

    def act(self, episode: str, step: int, **obs: Any) -> int:
        return self.send(
            {"cmd": "act", "episode": episode, "step": step, "steps": [step], "observations": [obs]}
        )

    def ping(self, episode: str | None = None, timeout: float = DEADLINE_S) -> dict[str, Any]:
        msg: dict[str, Any] = {"cmd": "ping"}
        if episode is not None:
            msg["episode"] = episode
        reply = self.request(msg, timeout)
        assert reply["ok"], reply
        return reply["result"]

    def close(self) -> None:
        if self.path:
            self._hang_up()
            return
        self.sock.close()
        self.ctx.term()


class _NoWait:
    """A blocking socket read without waiting, as robotd.stream.framing reads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def recvmsg_into(self, buffers: Any) -> tuple[int, Any, int, Any]:
        return self.sock.recvmsg_into(buffers, 0, socket.MSG_DONTWAIT)


class Worker:
    """`robotd serve POLICY --bind ipc://... FLAGS` with tests/ on the copies' path."""

    def __init__(self, policy: str, *flags: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="robotd-cp-"))  # ipc paths must stay short
        self.endpoint = f"ipc://{self.dir}/w.sock"
        self.out = self.dir / "out.txt"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
        argv = [sys.executable, "-m", "robotd", "serve", policy, "--bind", self.endpoint]
        with self.out.open("w") as sink:
            self.proc = subprocess.Popen(
                [*argv, *flags], env=env, stdout=sink, stderr=subprocess.STDOUT
            )
        wait_for(lambda: "listening on" in self.text() or self.proc.poll() is not None, "serve")
        assert self.proc.poll() is None, self.text()
        self.client = Client(self.endpoint)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def copy_pids(self) -> list[int]:
        return [c["pid"] for c in self.client.ping()["copies"]]

    def wait_ready(self, n: int) -> dict[str, Any]:
        """The ping result once `n` copies are ready and none is starting."""

        def ready() -> dict[str, Any] | None:
            health = self.client.ping()
            pool = health["pool"]
            return health if pool["ready"] >= n and pool["starting"] == 0 else None

        return wait_for(ready, f"{n} ready copies", every=0.05)

    def pid_of(self, episode: str) -> int:
        found = [c["pid"] for c in self.client.ping()["copies"] if c["episode"] == episode]
        assert len(found) == 1, self.client.ping()
        return found[0]

    def stop(self) -> None:
        """SIGTERM: a clean stop (exit 0) that leaves no copy behind."""
        pids = []
        try:
            pids = self.copy_pids()
        finally:
            self.client.close()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        text = self.text()
        shutil.rmtree(self.dir, ignore_errors=True)
        assert self.proc.returncode == 0, text
        for pid in pids:
            wait_for(lambda p=pid: not _alive(p), f"copy {pid} gone")

    def discard(self) -> None:
        """After a test that stopped the worker its own way: killed if it still runs, its
        directory removed (its socket and output)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.client.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def serve_fails(policy: str, *flags: str) -> tuple[int, str]:
    """`robotd serve` that must exit by itself: its exit code and output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    with tempfile.TemporaryDirectory(prefix="robotd-cp-") as tmp:
        argv = [sys.executable, "-m", "robotd", "serve", policy, "--bind", f"ipc://{tmp}/w.sock"]
        done = subprocess.run(
            [*argv, *flags], env=env, capture_output=True, text=True, timeout=DEADLINE_S
        )
    return done.returncode, done.stdout + done.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of an exited copy still answers kill(0): count it as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
