"""Exporting episodes whose camera differs in size (a "policy" run, 224x224, beside an
"all" run, 640x480) is refused the documented way: one line naming the episode and both
sizes, exit 2, before any video is encoded, nothing left on disk. Real trace files, real
OpenCV JPEGs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from trace_util import CONFIG, tick

import robotd.trace.lerobot as lerobot
from robotd.trace.export import ExportError, export_lerobot
from robotd.trace.store import TraceStore

REPO = Path(__file__).resolve().parent.parent
BASE = 1_790_000_000_000_000_000
DT = 33_333_333  # 30 Hz


def _run(root: Path, w: int, h: int, ticks: int = 12) -> Path:
    """One run of one episode whose camera `top` is w x h (real JPEG frames)."""
    store = TraceStore(root, 1 << 30, CONFIG)
    ep = store.begin_episode(1, "w1", "pick", log_time_ns=BASE - 1)
    for s in range(ticks):
        img = np.full((h, w, 3), 40 + 10 * s, np.uint8)
        ok, buf = cv2.imencode(".jpg", img)
        assert ok
        ep.frame("top", BASE + s * DT - 1000, buf.tobytes(), s)
        ep.write("/robot/tick", BASE + s * DT, tick(s) | {"skipped": False})
    ep.end("stopped", log_time_ns=BASE + ticks * DT)
    store.close()
    assert store.run_dir is not None
    return store.run_dir / "episode-000001.mcap"


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[Path, Path]:
    return _run(tmp_path / "pol", 224, 224), _run(tmp_path / "all", 640, 480)


def test_the_cli_refuses_a_size_mix_in_one_line_exit_2_leaving_nothing(mixed, tmp_path):
    small, large = mixed
    out = tmp_path / "out" / "dM"
    out.parent.mkdir()
    p = subprocess.run([sys.executable, "-m", "robotd", "export", str(small), str(large),
                        "--lerobot", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    line = lines[0]
    assert line.startswith(f"robotd export: {large}: camera top is 640x480"), line
    assert f"but {small}'s is 224x224" in line, line
    assert list(out.parent.iterdir()) == []  # neither the dataset nor its partial


@pytest.mark.parametrize("order", ["small_first", "large_first"])
def test_the_sizes_are_compared_before_any_video_is_encoded(mixed, tmp_path, monkeypatch,
                                                            order):
    small, large = mixed
    first, second = (small, large) if order == "small_first" else (large, small)
    encoded: list[Path] = []

    def spy(path, frames, fps, codec):  # any call would be encoding before the refusal
        encoded.append(path)
        raise AssertionError(f"encoded {path} before the size check")

    monkeypatch.setattr(lerobot, "write_video", spy)
    with pytest.raises(ExportError) as exc:
        export_lerobot([first, second], tmp_path / "ds")
    sizes = {small: "224x224", large: "640x480"}
    assert str(exc.value) == (
        f"{second}: camera top is {sizes[second]}, but {first}'s is {sizes[first]}; a "
        "dataset's camera has one size: export episodes recorded with the same trace.frames "
        "and cameras together")
    assert encoded == []
    assert not (tmp_path / "ds").exists()
    assert not any(p.name.startswith(".ds.partial") for p in tmp_path.iterdir())


def test_episodes_of_one_size_still_export(tmp_path):
    a, b = _run(tmp_path / "a", 224, 224), _run(tmp_path / "b", 224, 224)
    summary = export_lerobot([a, b], tmp_path / "ds")
    assert summary.episodes == 2 and summary.cameras == ["top"]
