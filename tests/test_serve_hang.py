"""`robotd serve --hang-s` has the bounds the config's `policy.hang_s` has, said in the same
words, refused as argparse refuses a bad value (exit 2, before anything is bound)."""

from __future__ import annotations

import pytest

from robotd.cli import main
from robotd.config import load_config
from robotd.config.policy import HANG_MAX_S, HANG_MIN_S
from robotd.errors import ConfigError
from tests.copy_util import Worker


def _refused(capsys: pytest.CaptureFixture[str], hang: str) -> str:
    """The serve command's last stderr line for `--hang-s HANG` (it must exit 2)."""
    argv = ["serve", "robotd.demo:DotFollower", "--bind", "ipc:///nonexistent/w.sock"]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--hang-s", hang])
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("hang", ["0.05", "1e-9", "0", "-1", "600.5", "1e9"])
def test_a_hang_out_of_bounds_is_refused_in_the_configs_words(capsys, hang):
    with pytest.raises(ConfigError) as config_error:
        load_config(None, [f"policy.hang_s={hang}"])
    # the config's own line for the same value, less its source
    rule = str(config_error.value).splitlines()[0].removeprefix("--set policy.hang_s: ")
    bound = f"<= {HANG_MAX_S:g}" if float(hang) > 1 else f">= {HANG_MIN_S:g}"
    assert rule.startswith(f"must be {bound} s, got ")
    assert _refused(capsys, hang) == f"robotd serve: error: argument --hang-s: {rule}"


@pytest.mark.parametrize(
    ("hang", "why"),
    [("nan", "must be a finite number of seconds, got 'nan'"),
     ("inf", "must be a finite number of seconds, got 'inf'"),
     ("soon", "must be a number of seconds, got 'soon'")],
)
def test_a_hang_that_is_no_finite_number_is_refused(capsys, hang, why):
    assert _refused(capsys, hang) == f"robotd serve: error: argument --hang-s: {why}"


def test_a_hang_on_the_floor_is_served_and_said_in_hello():
    worker = Worker("robotd.demo:DotFollower", "--copies", "0", "--hang-s", f"{HANG_MIN_S}")
    try:
        hello = worker.client.request({"cmd": "hello"})["result"]
        assert hello["copies"]["hang_s"] == HANG_MIN_S
    finally:
        worker.stop()


@pytest.mark.parametrize("seconds", ["0.05", "600.5"])
def test_a_first_call_allowance_out_of_bounds_is_refused_naming_the_key(seconds):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"policy.first_call_s={seconds}"])
    assert str(err.value).startswith("--set policy.first_call_s: must be "), err.value


def test_the_local_worker_is_given_the_configs_first_call_allowance():
    from robotd.runtime.children import worker_argv

    argv = worker_argv(load_config(None, ["policy.first_call_s=90"]), "ipc:///tmp/w.sock")
    assert argv[argv.index("--first-call-s") + 1] == "90.0"
    assert "--first-call-s" in worker_argv(load_config(None), "ipc:///tmp/w.sock")
