"""bench/merge.py runs and ends with its JSON line, every mode and latency in it (a smoke
run on a short virtual-clock episode: the figures themselves are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {
    "mode",
    "latency_ms",
    "jitter",
    "tracking_mean",
    "tracking_p95",
    "holds",
    "holds_after_first",
    "max_jump",
    "mean_abs_jerk",
    "delay_overruns",
    "clipped",
    "clamped",
}


def test_bench_merge_smoke() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/merge.py", "--steps", "45", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    results = out["results"]
    early = {(r["mode"], r["refill_steps"]) for r in out["back_to_back"]}
    assert early == {(m, n) for m in ("replace", "fade", "rtc") for n in (14, 29)}
    assert all(set(r) == FIELDS for r in results)
    assert [r["mode"] for r in out["with_shield"]] == ["replace", "fade", "rtc"]
    assert all(set(r) == FIELDS and r["latency_ms"] == 200 for r in out["with_shield"])
    runs = {(r["mode"], r["latency_ms"], r["jitter"]) for r in results}
    modes = ("sync", "naive", "replace", "fade", "ensemble", "rtc", "auto")
    for mode in modes:
        for ms in (0, 50, 100, 200, 400):
            assert (mode, ms, 0.0) in runs
        assert (mode, 200, 0.5) in runs
    assert len(results) == len(modes) * 6
    assert "rtc max_jump" in proc.stdout and "auto: holds after the first chunk" in proc.stdout
