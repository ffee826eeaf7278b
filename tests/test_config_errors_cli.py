"""`robotd check` refuses what `run` would refuse: exit 2, one line naming the source, the
key and the rule, no traceback. Also the start-up errors past the config (the run
directory, the policy's import) as one clear line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from robotd.config import DEFAULT_CONFIG
from robotd.runtime.rundir import RunDirError, check_run_dir, lock_run_dir
from robotd.worker.policy_load import PolicyLoadError, load_class
from tests.lines_util import at

SIM = DEFAULT_CONFIG.read_text()
SO101 = (Path(__file__).resolve().parents[1] / "config" / "so101.toml").read_text()


def check(path: Path, *overrides: str) -> tuple[int, str]:
    argv = [sys.executable, "-m", "robotd", "check", "--config", str(path)]
    for o in overrides:
        argv += ["--set", o]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr
    return done.returncode, done.stderr.strip()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.toml"
    path.write_text(text)
    return path


def test_check_refuses_an_infinite_float(tmp_path):
    path = write(tmp_path, SIM.replace("timeout_s = 10", "timeout_s = inf"))
    assert check(path) == (
        2,
        f"robotd: {at(path, 'timeout_s =')}: policy.timeout_s: must be a finite number, got inf",
    )


def test_check_refuses_a_ring_the_run_cannot_make(tmp_path):
    code, err = check(write(tmp_path, SIM), "cameras.top.fps=1000", "cameras.top.ring_seconds=60")
    assert code == 2 and err.startswith("robotd: --set cameras.top.ring_seconds: 60 s at")


def test_check_refuses_servo_ids_that_do_not_fit_the_joints(tmp_path):
    path = write(tmp_path, SO101.replace("ids = [1, 2, 3, 4, 5, 6]", "ids = [1, 2, 3, 4, 5]"))
    code, err = check(path)
    assert code == 2 and err.startswith(
        f"robotd: {at(path, 'ids =')}: joints.options.ids: one servo ID per"
    )


def test_check_names_a_set_unknown_section(tmp_path):
    assert check(write(tmp_path, SIM), "contrl.hz=100") == (
        2,
        "robotd: --set contrl.hz: contrl: unknown key",
    )


def test_check_refuses_a_run_dir_that_cannot_be_made(tmp_path):
    code, err = check(write(tmp_path, SIM), 'runtime.dir="/proc/nope"')
    assert code == 2 and err.startswith("robotd: --set runtime.dir: /proc/nope: cannot create it")
    path = write(tmp_path, SIM + '\n[runtime]\ndir = "/proc/nope"\n')
    code, err = check(path)
    assert code == 2 and err.startswith(
        f"robotd: {at(path, 'dir =', '[runtime')}: runtime.dir: /proc/nope: cannot"
    )


def test_a_run_dir_in_a_table_a_set_made_is_blamed_on_that_set_not_the_file(tmp_path):
    # the --set gives the whole [runtime] table (the file has none): its key is the --set's
    code, err = check(write(tmp_path, SIM), 'runtime={dir="/proc/nope"}')
    assert code == 2 and err.startswith("robotd: --set runtime.dir: /proc/nope: cannot create it")


def test_check_still_passes_a_good_config(tmp_path):
    run_dir = tmp_path / "run"
    assert check(write(tmp_path, SIM), f'runtime.dir="{run_dir}"')[0] == 0
    assert not run_dir.exists()  # checked, not made


def test_a_run_dir_that_cannot_be_made_names_runtime_dir():
    with pytest.raises(RunDirError, match=r"^runtime\.dir /proc/nope: cannot create it: "):
        lock_run_dir(Path("/proc/nope"))


def test_checking_a_run_dir_refuses_what_locking_it_would(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError):
        check_run_dir(tmp_path / "file" / "run")
    with pytest.raises(RunDirError, match="is not a directory"):
        check_run_dir(tmp_path / "file")
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o777)
    wide.chmod(0o777)
    with pytest.raises(RunDirError, match="wider than 0750"):
        check_run_dir(wide)
    check_run_dir(tmp_path / "a" / "b")  # made at run


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ('raise RuntimeError("CUDA not available")\n', "RuntimeError: CUDA not available"),
        ("def broken(:\n", "SyntaxError: "),
        ("raise SystemExit\n", None),  # not an Exception: not caught
    ],
)
def test_a_policy_module_that_raises_on_import_is_one_line(tmp_path, monkeypatch, source, said):
    name = f"raiseimp_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    if said is None:
        with pytest.raises(SystemExit):
            load_class(f"{name}:P")
        return
    with pytest.raises(PolicyLoadError) as err:
        load_class(f"{name}:P")
    text = str(err.value)
    assert text.startswith(f"policy.serve '{name}:P': importing module {name} raised {said}")
    assert "\n" not in text and err.value.__cause__ is None


def test_every_line_of_a_config_with_several_problems_is_led_by_robotd(tmp_path):
    text = SIM.replace("hz = 30", 'hz = "fast"').replace("spin_us = 200", "spin = 3")
    code, err = check(write(tmp_path, text))
    lines = err.splitlines()
    assert code == 2 and len(lines) == 2, err
    assert all(line.startswith("robotd: ") for line in lines), err
