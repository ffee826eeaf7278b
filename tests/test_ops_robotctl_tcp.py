"""`robotctl estop --config` for a daemon served over tcp with CURVE: with the operator's
keys it goes through the daemon (the handshake probe speaks CURVE too); without them it
is not refused but warned about, and goes to the lane.sock in the config's run directory."""

from __future__ import annotations

from pathlib import Path

from robotd.operator.client import ControlClient
from robotd.operator.robotctl import EXIT_OK
from tests.daemon_util import Daemon
from tests.robotctl_util import robotctl
from tests.test_operator_curve import _curve, daemon, keys

__all__ = ["daemon", "keys"]  # fixtures used here


def _config(tmp_path: Path, daemon: Daemon) -> Path:
    path = tmp_path / "robot.toml"
    path.write_text(
        f'[runtime]\ndir = "{daemon.dir}"\n'
        f'control_endpoint = "tcp://127.0.0.1:{daemon.port}"\n'
        f'telemetry_endpoint = "tcp://127.0.0.1:{daemon.port + 1}"\n'
        "[safety]\nmax_velocty = 1.0\n"
    )
    return path


def _state(daemon: Daemon, keys: Path, cmd: str = "status") -> dict:
    c = ControlClient(
        f"tcp://127.0.0.1:{daemon.port}", timeout_s=15, curve=_curve(keys, "operator")
    )
    try:
        return c.request(cmd)["result"]
    finally:
        c.close()


def test_estop_over_curve_from_a_config_with_keys_goes_through_the_daemon(daemon, keys, tmp_path):
    _state(daemon, keys, "clear_fault")
    out, _ = robotctl(
        "estop", "--config", str(_config(tmp_path, daemon)), "--timeout", "15",
        "--server-key", str(keys / "server.key"), "--key", str(keys / "operator.key_secret"),
    )  # fmt: skip
    assert out.returncode == EXIT_OK, out.stderr
    assert "via      lane.sock" not in out.stdout  # the daemon itself confirmed it
    assert _state(daemon, keys)["fault"]["cause"] == "estop"


def test_estop_over_curve_without_keys_falls_back_on_the_lane(daemon, keys, tmp_path):
    _state(daemon, keys, "clear_fault")
    out, _ = robotctl(
        "estop", "--config", str(_config(tmp_path, daemon)), "--timeout", "15",
        "--reason", "no keys here",
        env={"ROBOTD_SERVER_KEY": "", "ROBOTCTL_KEY": "", "XDG_CONFIG_HOME": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == EXIT_OK, out.stderr
    assert "warning: " in out.stderr and "--server-key" in out.stderr, out.stderr
    assert "only its lane.sock is tried" in out.stderr
    assert "via      lane.sock" in out.stdout and "e-stop: no keys here" in out.stdout
    # the daemon's status is the lane's report, a moment behind: wait for the lane's word
    daemon.wait_line(r"fault \{'cause': 'estop', 'detail': 'no keys here'")
