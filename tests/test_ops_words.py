"""robotctl's advice without a daemon: keygen says where each file of a pair goes for
whose pair it is (the daemon's server pair, or an operator's client pair), and a
malformed `params set` gives an example of what params are (the policy's parameters)."""

from __future__ import annotations

import json

import pytest

from robotd.operator.curve import key_kind
from tests.robotctl_util import robotctl


def test_the_servers_pair_is_advised_as_the_servers(tmp_path):
    out, _ = robotctl("keygen", "--dir", str(tmp_path), "--name", "server")
    assert out.returncode == 0, out.stderr
    public, secret = out.stdout.splitlines()
    assert public.startswith(f"public key  {tmp_path / 'server.key'}")
    assert "--server-key" in public and "operator" in public
    assert secret.startswith(f"secret key  {tmp_path / 'server.key_secret'}")
    assert "runtime.curve_secret_key" in secret and "stays with the daemon" in secret
    for wrong in ("curve_clients", "robotctl --key"):  # the client's advice
        assert wrong not in out.stdout, out.stdout


def test_a_clients_pair_is_advised_as_a_clients(tmp_path):
    out, _ = robotctl("keygen", "--dir", str(tmp_path), "--name", "observer")
    assert out.returncode == 0, out.stderr
    public, secret = out.stdout.splitlines()
    assert "runtime.curve_clients" in public and "--server-key" not in out.stdout
    assert f"robotctl --key {tmp_path / 'observer.key_secret'}" in secret
    home, _ = robotctl("keygen", env={"XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert home.returncode == 0, home.stderr
    assert "robotctl uses it by default" in home.stdout


def test_the_kind_can_be_said_and_json_carries_it(tmp_path):
    out, _ = robotctl(
        "--json", "keygen", "--dir", str(tmp_path), "--name", "arm", "--kind", "server"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kind"] == "server"
    out, _ = robotctl("keygen", "--dir", str(tmp_path), "--name", "server2", "--kind", "client")
    assert "runtime.curve_clients" in out.stdout


@pytest.mark.parametrize(
    ("name", "kind"),
    [("server", "server"), ("robot-server", "server"), ("server2", "server"),
     ("Server_a", "server"), ("robotctl", "client"), ("observer", "client"),
     ("myserver", "client")],
)  # fmt: skip
def test_the_kind_follows_the_name_when_not_given(name, kind):
    assert key_kind(name) == kind


def test_a_malformed_params_set_gives_a_policy_parameter_example(tmp_path):
    out, _ = robotctl("params", "set", "foo", "--endpoint", f"ipc://{tmp_path}/control.sock")
    assert out.returncode == 64
    assert "KEY=VALUE" in out.stderr and "gain=2.5" in out.stderr, out.stderr
    assert "control." not in out.stderr  # control.* are the config's, not the policy's
