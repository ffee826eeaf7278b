"""Start-up against a worker that is not there: bounded by --duration, stopped by a
signal, and an error that says why; every endpoint form's port checked at load.

Real daemons (tests.daemon_util): nothing listens on a port bound but never listened on,
so a connection to it is refused at once, and no other process can take it meanwhile."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_util import REPO, Daemon

HELLO_DEADLINE_S = 30.0  # robotd.link.connect: the wait without a --duration


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A local tcp port that refuses connections (bound, not listening) for the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.mark.parametrize("scheme", ["stream+tcp", "tcp"])
def test_an_absent_worker_is_waited_for_no_longer_than_the_duration(
    tmp_path: Path, refused_port: int, scheme: str
) -> None:
    endpoint = f"{scheme}://127.0.0.1:{refused_port}"
    started = time.monotonic()
    d = Daemon(tmp_path, "--worker", endpoint, "--duration", "3")
    assert d.wait_exit(timeout=90) == 2
    took = time.monotonic() - started
    log = "".join(d.wait_eof())
    want = f"policy worker at {endpoint} (--worker) did not answer hello within 3 s: "
    assert f"{want}connection refused" in log, log[-3000:]
    # Not the 30 s a run without --duration waits (start-up itself may take seconds here).
    assert took < HELLO_DEADLINE_S, f"took {took:.1f} s"


def test_a_signal_stops_the_wait_for_an_absent_worker(tmp_path: Path, refused_port: int) -> None:
    endpoint = f"stream+tcp://127.0.0.1:{refused_port}"
    d = Daemon(tmp_path, "--worker", endpoint)  # no --duration: it would wait 30 s
    waiting = f"policy worker at {endpoint} (--worker): no answer yet (connection refused)"
    d.wait_line(re.escape(waiting))
    asked = time.monotonic()
    d.signal(signal.SIGTERM)
    assert d.wait_exit(timeout=60) == 0
    assert time.monotonic() - asked < HELLO_DEADLINE_S - 5
    assert "stopped during start-up: no policy worker had answered" in "".join(d.wait_eof())


def _robotd(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "robotd", *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def _check(tmp: Path, config: str, endpoint: str) -> subprocess.CompletedProcess[str]:
    sets = ["--set", f'runtime.dir="{tmp}/run"', "--set", f'policy.worker="{endpoint}"']
    return _robotd("check", "--config", config, *sets)


@pytest.mark.parametrize(
    ("config", "link", "endpoint", "port"),
    [
        ("config/sim.toml", "robotd", "tcp://localhost:99999", "99999"),
        ("config/sim.toml", "robotd", "tcp://localhost:0", "0"),
        ("config/sim.toml", "robotd", "stream+tcp://localhost:99999", "99999"),
        ("config/openpi-aloha.toml", "openpi", "ws://127.0.0.1:99999", "99999"),
        ("config/openpi-aloha.toml", "openpi", "wss://gpu-box:70000/infer", "70000"),
    ],
)
def test_every_endpoint_form_has_its_port_checked(
    tmp_path: Path, config: str, link: str, endpoint: str, port: str
) -> None:
    out = _check(tmp_path, config, endpoint)
    assert out.returncode == 2, out.stdout[-500:]
    assert "policy" in out.stderr and "worker" in out.stderr
    assert f"{endpoint!r}: port {port} is out of range" in out.stderr
    # --worker is held to the same rules, before anything starts.
    run_dir = f'runtime.dir="{tmp_path}/run"'
    out = _robotd("run", "--config", config, "--set", run_dir, "--worker", endpoint)
    assert out.returncode == 2
    assert f"--worker: {endpoint!r}: port {port} is out of range" in out.stderr
    assert "Traceback" not in out.stderr


def test_good_ports_still_pass(tmp_path: Path) -> None:
    for config, endpoint in (
        ("config/sim.toml", "tcp://gpu-box:5555"),
        ("config/sim.toml", "tcp://[::1]:65535"),
        ("config/openpi-aloha.toml", "ws://gpu-box"),  # the scheme's port
        ("config/openpi-aloha.toml", "wss://gpu-box:8443/infer"),
    ):
        out = _check(tmp_path, config, endpoint)
        assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    "endpoint", ["tcp://[::1:5555", "stream+tcp://::1]:5555", "tcp://::1:5555"]
)
def test_a_bare_or_half_bracketed_ipv6_host_is_refused_at_load_not_at_connect(
    tmp_path: Path, endpoint: str
) -> None:
    out = _check(tmp_path, "config/sim.toml", endpoint)
    assert out.returncode == 2, out.stdout[-500:]
    assert "an IPv6 address goes whole in brackets, [::1]" in out.stderr, out.stderr
    assert "policy.worker" in out.stderr and "Traceback" not in out.stderr


def test_a_control_lane_that_dies_at_start_up_is_not_blamed_on_the_worker(tmp_path: Path) -> None:
    # a serial port that does not exist: the joint driver cannot open, the lane exits
    d = Daemon(tmp_path, "--config", str(REPO / "config" / "so101.toml"),
               "--set", 'joints.options.port="/dev/robotd-no-such-port"',
               "--set", 'cameras.front.options.fallback="pattern"',
               "--set", 'cameras.wrist.options.fallback="pattern"')
    assert d.wait_exit(timeout=90) != 0
    log = "".join(d.wait_eof())
    assert "control exited with code" in log, log[-3000:]
    assert "no policy worker had answered" not in log, log[-3000:]
