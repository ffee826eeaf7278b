"""bench/openpi.py runs and ends with its JSON line (a smoke run: speed is not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from peer_venv import REPO


def test_bench_smoke(peer: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "bench/openpi.py", "--calls", "10", "--runs", "1", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.splitlines()[-1])
    for name in ("native", "openpi_adapter", "openpi_client"):
        assert set(last[name]) == {"p50_ms", "p99_ms"} and last[name]["p50_ms"] > 0
    assert last["adapter_vs_client_p50"] > 0
    assert "p50 / openpi_client" in proc.stdout
