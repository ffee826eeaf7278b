"""The control and telemetry sockets over tcp with CURVE: authorised clients are answered,
anyone else gets no answer at all (logged once); tcp without keys never starts."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest
import zmq
import zmq.auth

from robotd import wire
from robotd.operator.client import ControlClient, CurveClient, Unreachable
from robotd.operator.curve import set_curve_client
from tests.daemon_util import REPO, Daemon
from tests.robotctl_util import robotctl


def _free_ports() -> int:
    """A port P with P and P+1 free (both sockets are bound by the daemon)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise AssertionError("no two free ports in a row")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("curve")
    clients = root / "clients"
    clients.mkdir()
    zmq.auth.create_certificates(root, "server")
    os.chmod(root / "server.key_secret", 0o640)
    zmq.auth.create_certificates(root, "operator")
    (clients / "operator.key").write_bytes((root / "operator.key").read_bytes())
    zmq.auth.create_certificates(root, "stranger")  # never authorised
    for secret in root.glob("*.key_secret"):
        os.chmod(secret, 0o600)
    return root


def _curve(keys, name: str) -> CurveClient:
    server_public, _ = zmq.auth.load_certificate(keys / "server.key")
    public, secret = zmq.auth.load_certificate(keys / f"{name}.key_secret")
    return CurveClient(server_public, public, secret)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, keys):
    port = _free_ports()
    d = Daemon(
        tmp_path_factory.mktemp("tcp"),
        "--set", 'robot.start="latched"',
        "--set", f'runtime.control_endpoint="tcp://127.0.0.1:{port}"',
        "--set", f'runtime.telemetry_endpoint="tcp://127.0.0.1:{port + 1}"',
        "--set", f'runtime.curve_secret_key="{keys / "server.key_secret"}"',
        "--set", f'runtime.curve_clients="{keys / "clients"}"',
    )  # fmt: skip
    d.wait_line(r"operator socket tcp://.* \(CURVE\)")
    d.port = port
    yield d
    d.signal()
    assert d.wait_exit() == 0


def test_an_authorised_client_is_answered(daemon, keys):
    c = ControlClient(
        f"tcp://127.0.0.1:{daemon.port}", timeout_s=15, curve=_curve(keys, "operator")
    )
    try:
        assert c.request("status")["result"]["state"] == "FAULT"
    finally:
        c.close()
    out, _ = robotctl(
        "status",
        "--endpoint", f"tcp://127.0.0.1:{daemon.port}",
        "--server-key", str(keys / "server.key"),
        "--key", str(keys / "operator.key_secret"),
        "--timeout", "15",
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.startswith("state    FAULT"), out.stderr


def test_an_unknown_key_gets_no_answer_and_is_logged_once(daemon, keys):
    for _ in range(2):
        c = ControlClient(
            f"tcp://127.0.0.1:{daemon.port}", timeout_s=1.5, curve=_curve(keys, "stranger")
        )
        try:
            with pytest.raises(Unreachable):
                c.request("status")
        finally:
            c.close()
    stranger, _ = zmq.auth.load_certificate(keys / "stranger.key")
    daemon.wait_line("refused a client with CURVE key " + re.escape(stranger.decode()))
    # a third try, then an authorised request: by then any second log line would be there
    c = ControlClient(
        f"tcp://127.0.0.1:{daemon.port}", timeout_s=1.5, curve=_curve(keys, "stranger")
    )
    with pytest.raises(Unreachable):
        c.request("status")
    c.close()
    ok = ControlClient(
        f"tcp://127.0.0.1:{daemon.port}", timeout_s=15, curve=_curve(keys, "operator")
    )
    assert ok.request("status")["ok"]
    ok.close()
    assert sum(stranger.decode() in line for line in daemon.log) == 1


def test_a_client_without_curve_gets_no_answer(daemon):
    c = ControlClient(f"tcp://127.0.0.1:{daemon.port}", timeout_s=1.5)
    try:
        with pytest.raises(Unreachable):
            c.request("status")
    finally:
        c.close()


def _subscriber(daemon, keys, name: str) -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    c = _curve(keys, name)
    set_curve_client(sub, c.server_public, c.public, c.secret)
    sub.setsockopt(zmq.SUBSCRIBE, b"status")
    sub.connect(f"tcp://127.0.0.1:{daemon.port + 1}")
    return sub


def test_telemetry_is_curve_too(daemon, keys):
    good, bad = _subscriber(daemon, keys, "operator"), _subscriber(daemon, keys, "stranger")
    try:
        assert good.poll(15000), "an authorised subscriber got no telemetry"
        topic, data = good.recv_multipart()
        assert topic == b"status" and wire.unpackb(data)["state"]["state"] == "FAULT"
        assert not bad.poll(1500)
    finally:
        good.close()
        bad.close()


def _robotd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "robotd", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_tcp_without_keys_is_refused_by_check_and_at_start(tmp_path):
    tcp = 'runtime.control_endpoint="tcp://127.0.0.1:5999"'
    check = _robotd("check", "--set", tcp)
    assert check.returncode == 2 and "served only with CURVE keys" in check.stderr
    run = _robotd("run", "--no-status", "--set", f'runtime.dir="{tmp_path}/run"', "--set", tcp)
    assert run.returncode == 2 and "served only with CURVE keys" in run.stderr
    assert "control:" not in run.stderr and not (tmp_path / "run").exists()  # nothing started


def test_unusable_key_files_are_refused_by_check(tmp_path, keys):
    base = [
        'runtime.control_endpoint="tcp://127.0.0.1:5999"',
        f'runtime.curve_clients="{keys / "clients"}"',
    ]
    missing = _robotd(
        "check",
        *[a for s in base for a in ("--set", s)],
        "--set",
        f'runtime.curve_secret_key="{tmp_path}/none"',
    )
    assert missing.returncode == 2 and "none: No such file" in missing.stderr
    loose = tmp_path / "loose.key_secret"
    loose.write_bytes((keys / "server.key_secret").read_bytes())
    os.chmod(loose, 0o644)
    wide = _robotd(
        "check",
        *[a for s in base for a in ("--set", s)],
        "--set",
        f'runtime.curve_secret_key="{loose}"',
    )
    assert wide.returncode == 2 and "readable by others" in wide.stderr
    public = _robotd(
        "check",
        *[a for s in base for a in ("--set", s)],
        "--set",
        f'runtime.curve_secret_key="{keys / "server.key"}"',
    )
    assert public.returncode == 2 and "holds no secret key" in public.stderr


def test_a_client_refused_at_the_handshake_is_told_not_left_hanging(daemon):
    """Once the server has refused the handshake of a client without CURVE (seen on the
    socket's monitor), a request still ends, as Unreachable: neither its send (bounded by
    SNDTIMEO, in case the connection's queue is gone) nor its wait may hang."""
    import threading

    from zmq.utils.monitor import recv_monitor_message

    c = ControlClient(f"tcp://127.0.0.1:{daemon.port}", timeout_s=1.5)
    failed = (
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    )
    mon = c.sock.get_monitor_socket(failed)
    # the client connected in its constructor, before the monitor: its refusal may be over
    # already, and libzmq does not retry a refused handshake, so connect again, watched
    endpoint = f"tcp://127.0.0.1:{daemon.port}"
    c.sock.disconnect(endpoint)
    c.sock.connect(endpoint)
    try:
        assert mon.poll(15000), "the refused handshake was never seen"
        recv_monitor_message(mon)
        outcome: list[BaseException | dict] = []

        def ask() -> None:
            try:
                outcome.append(c.request("status"))
            except BaseException as exc:
                outcome.append(exc)

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        t.join(30)
        assert not t.is_alive(), "the request hung: it never ended"
        assert isinstance(outcome[0], Unreachable), outcome
    finally:
        c.sock.disable_monitor()
        mon.close(linger=0)
        c.close()
