"""bench/merge.py runs and ends with its JSON line, every mode and latency in it (a smoke
run on a short virtual-clock episode: the figures themselves are not asserted); --sampled
is seeded, and at 0 the bench's policy never samples (its figures are the exact plan's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import merge
from robotd.demo import DotFollower

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
    assert out["parameters"] == {
        "steps": 45, "horizon": 30, "refill_steps": 14, "fade_steps": 5, "seed": 0, "sampled": 0.0
    }


def _runs(*argv: str) -> list[dict[str, Any]]:
    """replace and rtc at 200 ms on a short run of bench/merge.py's own choices and `argv`."""
    args = merge._parse(["--steps", "90", *argv])
    return [merge.run_one(mode, 200, 0.0, args) for mode in ("replace", "rtc")]


def test_sampled_chunks_are_seeded_and_sigma_0_is_the_exact_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sampled = _runs("--sampled", "0.05", "--seed", "3")
    assert _runs("--sampled", "0.05", "--seed", "3") == sampled  # bit for bit, per seed
    assert _runs("--sampled", "0.05", "--seed", "4") != sampled
    exact = _runs()
    assert all(e["tracking_mean"] != s["tracking_mean"] for e, s in zip(exact, sampled))

    def no_draw(*_: Any) -> None:
        raise AssertionError("sampled at sigma 0")

    # sigma 0 is today's bench: DotFollower without sampling, which never draws
    monkeypatch.setattr(DotFollower, "_deviation", no_draw)
    assert _runs("--sampled", "0") == exact
    assert _runs("--seed", "3") == _runs("--seed", "3", "--sampled", "0")
