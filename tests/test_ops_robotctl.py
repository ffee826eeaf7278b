"""robotctl against a real daemon, as an operator meets it: an e-stop found through a
config with mistakes still goes (only the keys that locate the daemon are read, a bad
one ignored with a warning naming it), other commands say the config is bad and still
ask the daemon, global options go before or after the command, and an e-stop that the
daemon took but its stopped control lane did not confirm is said as exactly that."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from robotd.operator.client import ControlClient
from robotd.operator.robotctl import EXIT_CONFIG, EXIT_OK, EXIT_UNREACHABLE
from tests.daemon_util import Daemon
from tests.robotctl_util import client, latched_daemon, robotctl

daemon = latched_daemon("ops")
__all__ = ["client"]  # a fixture used here

TYPO = "[safety]\nmax_velocty = 1.0\n"  # the walkthrough's typo'd key


def _config(tmp_path: Path, daemon: Daemon, runtime: str = "", rest: str = TYPO) -> Path:
    """A config that locates `daemon` by its runtime.dir, with `runtime` lines added to
    its [runtime] table and `rest` after it."""
    path = tmp_path / "kw.toml"
    path.write_text(f'[runtime]\ndir = "{daemon.dir}"\n{runtime}\n{rest}')
    return path


def _clear(client: ControlClient) -> None:
    client.request("clear_fault")
    assert client.request("status")["result"]["state"] == "IDLE"


def _estopped(client: ControlClient) -> bool:
    state = client.request("status")["result"]
    return state["state"] == "FAULT" and state["fault"]["cause"] == "estop"


def _child(daemon: Daemon, module: str) -> int:
    pid = daemon.proc.pid
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        if module in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
            return int(child)
    raise AssertionError(f"no {module} child of {pid}")


def test_estop_through_a_config_with_a_typo_goes(daemon, client, tmp_path):
    _clear(client)
    out, _ = robotctl("estop", "--config", str(_config(tmp_path, daemon)), "--reason", "typo")
    assert out.returncode == EXIT_OK, out.stderr
    assert _estopped(client)
    assert "max_velocty" not in out.stderr  # the e-stop reads only what locates the daemon


def test_estop_ignores_a_bad_locating_key_with_a_warning_naming_it(daemon, client, tmp_path):
    _clear(client)
    bad = _config(tmp_path, daemon, "control_endpoint = 5\ntelemetry_endpoint = 'udp://x'")
    out, _ = robotctl("estop", "--config", str(bad))
    assert out.returncode == EXIT_OK, out.stderr
    assert _estopped(client)
    assert re.search(r"warning: .*kw\.toml:\d+: runtime\.control_endpoint: must be a string",
                     out.stderr), out.stderr  # fmt: skip
    assert "runtime.telemetry_endpoint" in out.stderr and "ignored" in out.stderr
    # any other command refuses to guess where the daemon is (exit 78, naming the key)
    status, _ = robotctl("status", "--config", str(bad))
    assert status.returncode == EXIT_CONFIG and "runtime.control_endpoint" in status.stderr


def test_estop_with_an_unreadable_config_looks_in_the_default_place(daemon, client, tmp_path):
    if os.path.isdir("/run/robotd"):
        pytest.skip("a robotd service runs here: /run/robotd is found first")
    _clear(client)
    missing = tmp_path / "nope.toml"
    env = {"RUNTIME_DIRECTORY": str(daemon.dir)}  # the default place is the daemon's
    out, _ = robotctl("estop", "--config", str(missing), env=env)
    assert out.returncode == EXIT_OK, out.stderr
    assert f"warning: {missing}: no such config file: ignored" in out.stderr
    assert _estopped(client)
    js, _ = robotctl("status", "--config", str(missing), "--json", env=env)
    assert js.returncode == EXIT_CONFIG  # the rest do not guess


def test_other_commands_say_the_config_is_bad_and_still_ask(daemon, tmp_path):
    config = _config(tmp_path, daemon)
    out, _ = robotctl("status", "--config", str(config))
    assert out.returncode == EXIT_OK, out.stderr
    assert out.stdout.startswith("state    ")
    assert re.search(r"warning: .*kw\.toml:\d+: safety\.max_velocty: unknown key", out.stderr)
    js, _ = robotctl("status", "--json", "--config", str(config))
    assert js.returncode == EXIT_OK and "state" in json.loads(js.stdout)  # stdout: JSON only


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "{config}", "status"],
        ["--config", "{config}", "--json", "--timeout", "5", "status"],
        ["--json", "status", "--config", "{config}"],
        ["--endpoint", "{endpoint}", "status", "--timeout", "5"],
        ["--timeout", "5", "--json", "params", "--endpoint", "{endpoint}"],
        ["--endpoint", "ipc:///nowhere/control.sock", "status", "--endpoint", "{endpoint}"],
    ],
)
def test_global_options_go_before_or_after_the_command(daemon, tmp_path, argv):
    config = _config(tmp_path, daemon, rest="")
    given = [a.format(config=config, endpoint=daemon.control_endpoint) for a in argv]
    out, _ = robotctl(*given, env={"ROBOTD_ENDPOINT": ""})
    assert out.returncode == EXIT_OK, out.stderr
    if "--json" in given:
        assert isinstance(json.loads(out.stdout), dict)
    else:
        assert out.stdout.startswith("state    ")


def test_an_estop_the_stopped_lane_did_not_confirm_says_the_daemon_is_up(daemon, client):
    _clear(client)
    lane = _child(daemon, "robotd.control.process")
    os.kill(lane, signal.SIGSTOP)  # the main process takes the e-stop; its lane is stopped
    try:
        out, _ = robotctl(
            "estop", "--timeout", "1", "--reason", "lane stopped",
            env={"ROBOTD_ENDPOINT": daemon.control_endpoint},
        )  # fmt: skip
        daemon.wait_line(r"operator: estop reason='lane stopped'")  # the daemon took it
    finally:
        os.kill(lane, signal.SIGCONT)
    said = out.stderr
    assert out.returncode == EXIT_UNREACHABLE, said
    assert "neither the daemon nor its control lane confirmed" in said, said
    assert "the daemon is up but its control lane did not confirm" in said, said
    assert "may NOT be stopped" in said and "not running" not in said, said
    daemon.wait_line(r"fault \{'cause': 'estop', 'detail': 'lane stopped'")  # it took effect


def test_an_estop_nobody_took_says_the_daemon_did_not_even_connect(daemon, client):
    _clear(client)
    lane = _child(daemon, "robotd.control.process")
    stopped = [daemon.proc.pid, lane]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        out, _ = robotctl(
            "estop", "--timeout", "1", env={"ROBOTD_ENDPOINT": daemon.control_endpoint}
        )
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    said = out.stderr
    assert out.returncode == EXIT_UNREACHABLE, said
    assert "not even to the connection" in said and "is up" not in said, said
    assert "may NOT be stopped" in said, said


def test_a_daemon_answering_timeout_has_not_confirmed_the_estop(daemon, client):
    _clear(client)
    lane = _child(daemon, "robotd.control.process")
    os.kill(lane, signal.SIGSTOP)  # the daemon gives up on its lane after 5 s: `timeout`
    try:
        out, _ = robotctl(
            "estop", "--timeout", "8", "--reason", "lane late",
            env={"ROBOTD_ENDPOINT": daemon.control_endpoint},
        )  # fmt: skip
    finally:
        os.kill(lane, signal.SIGCONT)
    said = out.stderr
    assert out.returncode == EXIT_UNREACHABLE, said  # not 1: nobody confirmed it
    assert "did not confirm: it said timeout" in said and "may NOT be stopped" in said, said
    daemon.wait_line(r"fault \{'cause': 'estop', 'detail': 'lane late'")
