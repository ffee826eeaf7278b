"""The operator's side of the control socket: find the daemon, ask it, and say honestly
when nobody answered.

`Unreachable` means no daemon answered: at once when the ipc socket file is missing or
nobody listens on it, after the timeout (default 1 s) when the daemon does not reply.
"""

from __future__ import annotations

import math
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from robotd import wire
from robotd.operator.curve import set_curve_client
from robotd.operator.requests import MAX_WAIT_S
from robotd.runtime.bridge import lane_endpoint
from robotd.runtime.rundir import lock_holder, pid_alive
from robotd.runtime.view import status_dict

DEFAULT_TIMEOUT_S = 1.0
MAX_REPLY_BYTES = 64 << 20


class Unreachable(Exception):
    """No daemon answered; the message says what was tried and what was found."""

    sent = False  # the request went out: it may still be carried out


class NoReply(Unreachable):
    """The request was sent and no reply came in time: the daemon may still act on it."""

    sent = True


def check_timeout(timeout_s: float) -> float:
    """`timeout_s` when it is a number of seconds > 0 and finite; ValueError otherwise."""
    if not (isinstance(timeout_s, int | float) and 0 < timeout_s < math.inf):
        raise ValueError(f"timeout {timeout_s!r}: must be seconds > 0 (and finite)")
    return float(timeout_s)


@dataclass(frozen=True)
class CurveClient:
    """The keys a client needs for a tcp endpoint: the server's public key, its own pair."""

    server_public: bytes
    public: bytes
    secret: bytes


def ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint.removeprefix("ipc://")) if endpoint.startswith("ipc://") else None


def starting(path: Path) -> str:
    """Words for a daemon alive in `path`'s directory whose socket `path` is not open yet
    (it opens once the policy worker answers hello: a policy loading for minutes) or no
    longer (stopping); "" when no daemon holds that directory."""
    pid = lock_holder(path.parent)
    if pid is None:
        return ""
    if not pid_alive(pid):  # the lock lives on in its control lane (rundir.lock_run_dir)
        return (
            f"robotd pid {pid} is gone, and its control lane still holds the robot: it "
            "holds, then applies its e-stop category and exits; an e-stop reaches it "
            "(lane.sock)"
        )
    words = (
        f"robotd pid {pid} is starting or stopping: its operator sockets open once its "
        "policy worker answers hello"
    )
    if Path(lane_endpoint(path.parent).removeprefix("ipc://")).exists():
        words += "; an e-stop reaches its control lane meanwhile (lane.sock)"
    return words


def probe(endpoint: str, daemon: bool = True) -> None:
    """Raise Unreachable at once when an ipc endpoint has no daemon behind it (no socket
    file, not a socket, nobody listening: a stale file). tcp is left to the timeout.
    `daemon`: the endpoint is the daemon's own, so a missing or stale one is told apart
    from a daemon starting or stopping (`starting`)."""
    path = ipc_path(endpoint)
    if path is None:
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        gone = f"no daemon: {path} does not exist"
        raise Unreachable((daemon and starting(path)) or gone) from None
    except PermissionError:
        raise Unreachable(
            f"cannot reach {path}: permission denied (operators join the daemon's group: "
            "sudo usermod -aG robotd $USER, then log in again)"
        ) from None
    if not stat.S_ISSOCK(st.st_mode):
        raise Unreachable(f"no daemon: {path} is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(DEFAULT_TIMEOUT_S)
        try:
            s.connect(str(path))
        except ConnectionRefusedError:
            stale = f"no daemon listens on {path} (a stale socket file)"
            raise Unreachable((daemon and starting(path)) or stale) from None
        except PermissionError:
            raise Unreachable(f"cannot reach {path}: permission denied") from None
        except OSError as exc:
            raise Unreachable(f"cannot reach {path}: {exc.strerror}") from None


class ControlClient:
    """A DEALER on the operator socket; one request at a time, each with its own id."""

    def __init__(
        self,
        endpoint: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        curve: CurveClient | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = check_timeout(timeout_s)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
        # A server that refuses our security handshake (CURVE keys, or none) tears the
        # connection's queue down, and a DEALER with none blocks on send for good: bound it.
        self.sock.setsockopt(zmq.SNDTIMEO, max(1, int(self.timeout_s * 1000)))
        if curve is not None:
            set_curve_client(self.sock, curve.server_public, curve.public, curve.secret)
        self.sock.connect(endpoint)
        self._id = int(time.time() * 1000) % 1_000_000

    def request(self, cmd: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        """The reply `{id, ok, result | error}`; Unreachable when none came in time."""
        self._id += 1
        # wait_s: a command that would move the robot is not carried out after we gave up
        msg: dict[str, Any] = {
            "id": self._id,
            "cmd": cmd,
            "args": args or {},
            "wait_s": min(self.timeout_s, MAX_WAIT_S),  # a longer wait is as good as this
        }
        if self.endpoint.startswith("ipc://"):  # same machine, same clock: see Request.sent_ns
            msg["sent_ns"] = time.monotonic_ns()
        try:
            self.sock.send(wire.packb(msg))
        except zmq.Again:
            raise Unreachable(
                f"could not send to {self.endpoint} within {self.timeout_s:g} s: no "
                "connection (the daemon is not running, or refused this client's security "
                "handshake: its CURVE keys); nothing was sent"
            ) from None
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0 or not self.sock.poll(left):
                raise NoReply(
                    f"no reply from {self.endpoint} within {self.timeout_s:g} s "
                    "(the daemon is not running, hung, or does not accept this client)"
                )
            try:
                reply = wire.unpackb(self.sock.recv())
            except wire.WireError:
                continue  # not for us (or garbage): keep waiting for ours
            if isinstance(reply, dict) and reply.get("id") == self._id and "ok" in reply:
                return reply

    def close(self) -> None:
        self.sock.close(linger=0)


def request_once(
    endpoint: str,
    cmd: str,
    args: dict[str, Any] | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    curve: CurveClient | None = None,
) -> dict[str, Any]:
    """Probe, ask once, close: the reply, or Unreachable."""
    probe(endpoint)
    client = ControlClient(endpoint, timeout_s, curve)
    try:
        return client.request(cmd, args)
    finally:
        client.close()


def estop_via_lane(control_endpoint: str, reason: str, timeout_s: float) -> dict[str, Any]:
    """The e-stop straight to the control lane's own socket (lane.sock, beside
    control.sock), for when the main process does not answer: the lane's status once it
    acknowledged; Unreachable when no acknowledgement came within `timeout_s` (then
    nothing is claimed: the robot may not be stopped)."""
    from robotd.lane import codec
    from robotd.lane.messages import NOT_WRITTEN, Estop, Reply

    control = ipc_path(control_endpoint)
    if control is None:
        raise Unreachable("no control lane socket to fall back on over tcp")
    lane = ipc_path(lane_endpoint(control.parent))
    assert lane is not None
    probe(f"ipc://{lane}", daemon=False)  # the daemon's state is said already
    rid = int(time.time() * 1000) % 1_000_000
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"ipc://{lane}")
        sock.send(codec.encode(Estop(rid, reason[:200], time.monotonic_ns())), zmq.NOBLOCK)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000) + 1):
            try:
                reply = codec.decode_up(sock.recv())
            except codec.LaneError:
                continue
            if isinstance(reply, Reply) and reply.id == rid:
                if not reply.ok and reply.code == NOT_WRITTEN:  # latched, the write failed
                    raise Unreachable(f"via lane.sock: {reply.message}")
                if not reply.ok:
                    raise Unreachable(f"the control lane refused the e-stop: {reply.message}")
                got = {**status_dict(reply.status), "via": "lane.sock"}
                return {**got, "written_ns": reply.written_ns}
    except zmq.ZMQError as exc:
        raise Unreachable(f"the control lane's socket {lane}: {exc}") from None
    finally:
        sock.close()
    raise Unreachable(
        f"the control lane did not acknowledge an e-stop on {lane} within {timeout_s:g} s: "
        "the robot may NOT be stopped; check it, or cut its power"
    )
