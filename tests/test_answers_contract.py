"""A contract's errors name the stream's key for every rule of a Stream (docs/contract.md
promises it), as a policy declares them in Python and as `robotd serve` says them when the
policy's module cannot be imported (a real process); and the demo config says that its
policy.args are the demo's alone."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from robotd.contract import Camera, ContractError, Observations, Stream
from tests.copy_util import ROOT

KEYED = "observations.streams['top']"


@pytest.mark.parametrize(
    ("stream", "said"),
    [
        ("Stream(at=[5, 0])", f"{KEYED}.at: offset 5 > 0 (offsets must be <= 0)"),
        ("Stream(at=[-2, -2, 0])", f"{KEYED}.at: duplicate offset -2 (each offset once)"),
        ("Stream(at=list(range(-300, 1)))", f"{KEYED}.at: window of 301 entries (at most 256)"),
        ("Stream(at=[])", f"{KEYED}.at: empty window"),
        ("Stream(at=[0], every=2)", f"{KEYED}: at and every both set"),
        ("Stream(every=-1)", f"{KEYED}.every: every -1 must be > 0"),
        ("Stream(at=[-1.5, 0])", f"{KEYED}.at: offset -1.5 is not a whole number of steps"),
    ],
)
def test_every_stream_rule_names_the_key(stream: str, said: str) -> None:
    with pytest.raises(ContractError) as info:
        eval(f'Observations(streams={{"joints.pos": Stream(), "top": {stream}}})')
    assert said in str(info.value)
    assert "stream.at" not in str(info.value) and "stream.every" not in str(info.value)


def test_a_stream_alone_still_checks_its_fields() -> None:
    """What a Stream can tell without its key it tells at once: a field of the wrong type or
    an unknown one. Its schedule is the Observations' to check (with the key)."""
    with pytest.raises(ContractError, match=r"^stream\.at: Input should be a valid list"):
        Stream(at="x")  # type: ignore[arg-type]
    with pytest.raises(ContractError, match=r"^stream\.offsets: unknown field"):
        Stream(offsets=[0])  # type: ignore[call-arg]
    with pytest.raises(ContractError, match=r"^camera\.quality: 0 out of range"):
        Camera(quality=0)
    held = Stream(at=[5, 0])  # built before the dict that names it
    with pytest.raises(ContractError, match=r"^observations\.streams\['wrist'\]\.at: offset 5"):
        Observations(streams={"wrist": held})


def test_serve_names_the_key_of_a_bad_stream(tmp_path: Path) -> None:
    """The walkthrough's policy: `robotd serve` cannot import it and says which stream."""
    (tmp_path / "pos_offset.py").write_text(
        "from robotd.contract import Observations, Stream\n"
        "class PosOffset:\n"
        '    observations = Observations(streams={"top": Stream(at=[5, 0]), '
        '"joints.pos": Stream()})\n'
        "    def infer(self, inputs):\n"
        "        return [[0.0, 0.0, 0.0]]\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    argv = [sys.executable, "-m", "robotd", "serve", "pos_offset:PosOffset"]
    argv += ["--bind", f"ipc://{tmp_path}/w.sock"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"ContractError: {KEYED}.at: offset 5 > 0 (offsets must be <= 0)" in done.stderr


@pytest.mark.parametrize("path", ["config/sim.toml", "robotd/data/sim.toml"])
def test_the_demo_config_says_its_args_are_the_demos(path: str) -> None:
    """A config copied from sim.toml with another policy must reset policy.args: the file
    says so right above them, and the README's "Writing a policy" does too."""
    text = (ROOT / path).read_text()
    assert tomllib.loads(text)["policy"]["args"] == {"latency_ms": 0}
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("args = "))
    said = " ".join(line for line in lines[at - 3 : at] if line.startswith("#"))
    assert "DotFollower" in said and "args = {}" in said and "policy.args={}" in said
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Writing a policy", 1)[1].split("\n## ", 1)[0]
    assert "reset `policy.args`" in section and "latency_ms" in section
