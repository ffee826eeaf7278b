"""robotctl is honest: exit 0 ok, 1 error reply, 2 nobody answered (at once when there is
no socket, after the timeout when the daemon hangs), never a traceback; `watch` says
"no daemon" and "stale" as such and sends an e-stop on `e`."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat

import pytest

from robotd.operator.locate import locate
from tests.daemon_util import wait_until
from tests.robotctl_util import PtyWatch, client, latched_daemon, robotctl

daemon = latched_daemon("ctl")
__all__ = ["client"]  # a fixture used here


def _at(endpoint: str) -> dict[str, str]:
    return {"ROBOTD_ENDPOINT": endpoint}


def test_no_socket_file_is_unreachable_at_once(tmp_path):
    out, took = robotctl("status", "--timeout", "20", env=_at(f"ipc://{tmp_path}/control.sock"))
    assert out.returncode == 2 and "does not exist" in out.stderr
    assert took < 15  # it did not wait for the timeout
    js, _ = robotctl("status", "--json", env=_at(f"ipc://{tmp_path}/control.sock"))
    assert js.returncode == 2 and json.loads(js.stdout)["error"]["code"] == "unreachable"


def test_a_dead_socket_file_is_unreachable_at_once(tmp_path):
    path = tmp_path / "control.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens: what a killed daemon leaves
    assert stat.S_ISSOCK(path.stat().st_mode)
    out, took = robotctl("status", "--timeout", "20", env=_at(f"ipc://{path}"))
    assert out.returncode == 2 and "stale socket file" in out.stderr
    assert took < 15


def test_a_hung_daemon_is_unreachable_after_the_timeout(daemon):
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        out, took = robotctl("status", "--timeout", "1", env=_at(daemon.control_endpoint))
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    assert out.returncode == 2 and "no reply" in out.stderr and "within 1 s" in out.stderr
    assert 1.0 <= took < 30


def test_estop_against_no_daemon_says_so_and_claims_nothing(tmp_path):
    out, _ = robotctl("estop", env=_at(f"ipc://{tmp_path}/control.sock"))
    assert out.returncode == 2
    assert "does not exist" in out.stderr and "FAULT" not in out.stdout + out.stderr


def test_error_reply_is_exit_1_and_json_carries_it(daemon):
    out, _ = robotctl("reset_done", env=_at(daemon.control_endpoint))
    assert out.returncode == 1 and "reset_done: bad_state" in out.stderr
    js, _ = robotctl("reset_done", "--json", env=_at(daemon.control_endpoint))
    assert js.returncode == 1
    assert json.loads(js.stdout) == {
        "ok": False,
        "error": {"code": "bad_state", "message": json.loads(js.stdout)["error"]["message"]},
    }


def test_human_and_json_status(daemon):
    human, _ = robotctl("status", env=_at(daemon.control_endpoint))
    assert human.returncode == 0 and human.stdout.startswith("state    FAULT — started latched")
    js, _ = robotctl("status", "--json", env=_at(daemon.control_endpoint))
    assert js.returncode == 0 and json.loads(js.stdout)["state"] == "FAULT"


def test_a_closed_pipe_and_usage_errors_print_no_traceback(daemon, tmp_path):
    import subprocess
    import sys

    from tests.daemon_util import REPO

    piped = subprocess.run(
        f"{sys.executable} -m robotd.operator.robotctl params | true",
        shell=True,
        cwd=REPO,
        env={**os.environ, **_at(daemon.control_endpoint)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in piped.stderr and "Error" not in piped.stderr, piped.stderr
    bad, _ = robotctl("launch")
    assert bad.returncode == 64 and "Traceback" not in bad.stderr


def test_keygen_writes_a_pair_and_never_overwrites(tmp_path):
    out, _ = robotctl("keygen", "--dir", str(tmp_path / "keys"), "--name", "op")
    assert out.returncode == 0, out.stderr
    secret = tmp_path / "keys" / "op.key_secret"
    assert (tmp_path / "keys" / "op.key").is_file()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    again, _ = robotctl("keygen", "--dir", str(tmp_path / "keys"), "--name", "op")
    assert again.returncode == 78 and "not overwritten" in again.stderr


def test_endpoint_found_in_the_users_runtime_dir(tmp_path, monkeypatch):
    if os.path.isdir("/run/robotd"):
        pytest.skip("a robotd service runs here: /run/robotd is found first")
    for var in ("ROBOTD_ENDPOINT", "RUNTIME_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    target = locate()
    assert target.control == f"ipc://{tmp_path}/robotd/control.sock"
    assert target.telemetry == f"ipc://{tmp_path}/robotd/telemetry.sock"


def test_watch_shows_no_daemon_and_quits_on_ctrl_c(tmp_path):
    w = PtyWatch("--endpoint", f"ipc://{tmp_path}/control.sock")
    try:
        w.read_until(r"NO DAEMON .*telemetry\.sock does not exist")
        w.read_until(r"\[e\] E-STOP")
        w.interrupt()
    finally:
        code = w.close()
    assert code == 0 and "Traceback" not in w.text()


def test_watch_goes_stale_when_the_daemon_stops_answering(daemon):
    w = PtyWatch("--endpoint", daemon.control_endpoint)
    try:
        w.read_until(r"FAULT\s+started latched")
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        try:
            w.read_until(r"STALE\s+last update [3-9] s ago", timeout=30)
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
    finally:
        assert w.close() == 0


def test_the_e_key_sends_an_estop_and_says_so(daemon, client):
    client.request("clear_fault")
    assert client.request("start")["result"]["state"] == "RUNNING"
    w = PtyWatch("--endpoint", daemon.control_endpoint)
    try:
        w.read_until(r"RUNNING")
        w.press("e")
        w.read_until(r"E-STOP sent: state\s+FAULT — e-stop: robotctl watch")
        w.read_until(r"E-STOP\s+FAULT\s+e-stop: robotctl watch")  # the live state, in red
    finally:
        assert w.close() == 0

    def latched() -> bool:
        st = client.request("status")["result"]
        return st["state"] == "FAULT" and st["fault"]["cause"] == "estop"

    wait_until(latched, 10, "the e-stop from watch")
