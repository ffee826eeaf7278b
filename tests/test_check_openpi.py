"""`robotd check` refuses what the openpi link would refuse when it connects: a wss://
server's CA bundle (policy.openpi.ca_file) that is missing or holds no certificate."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import pytest

from robotd.cli import main
from tests.daemon_util import REPO

LIBERO = REPO / "config" / "openpi-libero.toml"


def check(tmp: Path, capsys: pytest.CaptureFixture[str], *sets: str) -> tuple[int, str]:
    argv = ["check", "--config", str(LIBERO), "--set", f'runtime.dir="{tmp}/run"']
    code = main([*argv, *(a for s in sets for a in ("--set", s))])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("content, why", [(None, "No such file"), ("not a certificate", "no cert")])
def test_a_ca_file_the_link_could_not_read_is_refused(tmp_path, capsys, content, why) -> None:
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_text(content)
    code, err = check(
        tmp_path, capsys, 'policy.worker="wss://gpu-box:8000"', f'policy.openpi.ca_file="{ca}"'
    )
    assert code == 2, err
    assert f"--set policy.openpi.ca_file: '{ca}': " in err and why in err, err


def test_a_readable_ca_file_passes_and_ws_never_reads_it(tmp_path, capsys) -> None:
    bundle = ssl.get_default_verify_paths().cafile
    if not bundle or not Path(bundle).is_file():
        pytest.skip("this machine has no CA bundle file to stand in for a server's CA")
    ca = Path(shutil.copy(bundle, tmp_path / "ca.pem"))
    wss = ('policy.worker="wss://gpu-box:8000"', f'policy.openpi.ca_file="{ca}"')
    assert check(tmp_path, capsys, *wss)[0] == 0
    ws = ('policy.worker="ws://gpu-box:8000"', f'policy.openpi.ca_file="{tmp_path}/none.pem"')
    assert check(tmp_path, capsys, *ws)[0] == 0  # plain ws: the link never reads it
