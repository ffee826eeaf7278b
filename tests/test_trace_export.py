"""Export to a LeRobot v3.0 dataset: a recorded episode read back frame by frame, the
layout read back with pyarrow against LeRobot's documented format, and (when a python
with lerobot is named by ROBOTD_LEROBOT_PYTHON) through LeRobot's own loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trace_util import CONFIG, tick

from robotd.trace.export import ExportError, export_lerobot
from robotd.trace.export import main as export_main
from robotd.trace.store import TraceStore

BASE = 1_790_000_000_000_000_000
DT = 33_333_333  # 30 Hz
TICKS = 40
FRAME_EVERY = 2
W, H = 160, 120


def _image(cam: str, ep: int, k: int) -> np.ndarray:
    """A smooth picture a video codec keeps: a gradient and a block that moves with k."""
    img = np.zeros((H, W, 3), np.uint8)
    img[:] = np.linspace(30, 90, W, dtype=np.uint8)[None, :, None]
    img[:, :, 0 if cam == "top" else 2] += np.uint8(40 * ep)
    x = 4 + (k * 7) % (W - 28)
    y = 10 + (k * 3) % (H - 34)
    img[y : y + 24, x : x + 24] = (250, 250, 250)
    return img


def _jpeg(img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    return buf.tobytes()


def record(root: Path, episodes: int = 2, config: dict = CONFIG) -> Path:
    store = TraceStore(root, 1 << 30, config)
    for e in range(episodes):
        t0 = BASE + e * 10**11
        ep = store.begin_episode(e + 1, "w1", f"task {e % 2}", log_time_ns=t0 - 1)
        for s in range(TICKS):
            t = t0 + s * DT
            if s % FRAME_EVERY == 0:
                for cam in ("top", "wrist"):
                    ep.frame(cam, t - 1000, _jpeg(_image(cam, e, s // FRAME_EVERY)), s)
            ep.write("/robot/tick", t, tick(s, ep=e + 1))
        ep.end("stopped", {"success": e == 0, "notes": f"note {e}"}, log_time_ns=t + 1)
    store.close()
    return store.run_dir


def _expected_action(s: int) -> list[float]:
    last = None
    for i in range(s + 1):
        target = tick(i)["target"]
        last = target if target is not None else last
    return last if last is not None else tick(s)["pos"]


def test_export_reads_back_frame_by_frame(tmp_path):
    run = record(tmp_path / "runs")
    out = tmp_path / "ds"
    summary = export_lerobot([run], out)
    assert (summary.episodes, summary.frames, summary.fps) == (2, 2 * TICKS, 30)
    info = json.loads((out / "meta/info.json").read_text())
    for e in range(2):
        table = pq.read_table(out / f"data/chunk-000/file-{e:03d}.parquet")
        rows = table.to_pylist()
        assert len(rows) == TICKS
        for s, row in enumerate(rows):
            assert row["observation.state"] == np.float32(tick(s)["pos"]).tolist()
            assert row["action"] == np.float32(_expected_action(s)).tolist()
            assert row["timestamp"] == np.float32(s / 30)
            assert (row["frame_index"], row["episode_index"]) == (s, e)
            assert row["index"] == e * TICKS + s and row["task_index"] == e % 2
        for cam in ("top", "wrist"):
            video = out / info["video_path"].format(
                video_key=f"observation.images.{cam}", chunk_index=0, file_index=e)
            cands = [cv2.imdecode(np.frombuffer(_jpeg(_image(cam, e, k)), np.uint8), 1)
                     for k in range(TICKS // FRAME_EVERY)]
            cap = cv2.VideoCapture(str(video))
            assert cap.get(cv2.CAP_PROP_FPS) == 30
            got = 0
            while True:
                ok, frame = cap.read()
                if not ok:
                    break
                mse = [float(np.mean((frame.astype(float) - c) ** 2)) for c in cands]
                want = got // FRAME_EVERY  # the newest frame at tick `got`
                assert int(np.argmin(mse)) == want, (cam, e, got)
                assert 10 * np.log10(255**2 / mse[want]) > 28  # PSNR, dB
                got += 1
            cap.release()
            assert got == TICKS


def test_layout_matches_lerobot_v3(tmp_path):
    out = tmp_path / "ds"
    export_lerobot([record(tmp_path / "runs")], out)
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 30
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (2, 80, 2)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == (
        "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
    assert info["splits"] == {"train": "0:2"}
    f = info["features"]
    assert f["observation.state"] == {"dtype": "float32", "shape": [3],
                                      "names": CONFIG["joints"]["names"]}
    assert f["action"]["shape"] == [3]
    cam = f["observation.images.top"]
    assert cam["dtype"] == "video" and cam["shape"] == [H, W, 3]
    assert cam["info"]["video.codec"] == "mpeg4" and cam["info"]["video.fps"] == 30
    for key in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert f[key]["shape"] == [1]
    schema = pq.read_schema(out / "data/chunk-000/file-000.parquet")
    state = schema.field("observation.state").type  # what datasets' List(float32, length=3) is
    assert pa.types.is_fixed_size_list(state) and state.list_size == 3
    assert state.value_type == pa.float32() and schema.field("timestamp").type == pa.float32()
    tasks = pq.read_table(out / "meta/tasks.parquet")
    assert tasks.to_pydict() == {"task_index": [0, 1], "task": ["task 0", "task 1"]}
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["task"]
    eps = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["length"] for e in eps] == [40, 40] and eps[1]["tasks"] == ["task 1"]
    assert [(e["dataset_from_index"], e["dataset_to_index"]) for e in eps] == [(0, 40), (40, 80)]
    assert eps[1]["videos/observation.images.wrist/file_index"] == 1
    assert eps[1]["videos/observation.images.wrist/to_timestamp"] == pytest.approx(40 / 30)
    assert [e["robotd/success"] for e in eps] == [True, False]
    assert [e["robotd/outcome"] for e in eps] == ["stopped", "stopped"]
    assert [e["robotd/skipped"] for e in eps] == [4, 4]  # tick() skips steps 0, 11, 22, 33
    for e in eps:  # per-episode image stats too, (3, 1, 1) per channel as LeRobot's
        mean = np.array(e["stats/observation.images.top/mean"])
        assert mean.shape == (3, 1, 1) and ((mean >= 0) & (mean <= 1)).all()
        assert e["stats/observation.images.wrist/count"] == [40]
    stats = json.loads((out / "meta/stats.json").read_text())
    assert set(stats["action"]) == {"min", "max", "mean", "std", "count", "q01", "q10", "q50",
                                    "q90", "q99"}
    assert stats["observation.state"]["count"] == [80]
    assert np.array(stats["observation.images.top"]["mean"]).shape == (3, 1, 1)


def test_export_refuses_what_it_cannot_do(tmp_path, capsys):
    run = record(tmp_path / "runs", episodes=1)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ExportError, match="not empty"):
        export_lerobot([run], tmp_path / "full")
    with pytest.raises(ExportError, match="neither a run directory"):
        export_lerobot([tmp_path / "nothing"], tmp_path / "ds")
    odd = record(tmp_path / "odd", episodes=1, config={**CONFIG, "control": {"hz": 12.5}})
    assert export_main([str(odd), "--lerobot", str(tmp_path / "ds")]) == 2
    assert "whole number" in capsys.readouterr().err
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".ds.partial-*"))


LEROBOT_PYTHON = os.environ.get("ROBOTD_LEROBOT_PYTHON")
_LOADER = r"""
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

def pixels(img):  # LeRobot's C H W floats in 0..1 as H W C bytes, RGB
    return img.mul(255).round().byte().permute(*range(img.dim() - 3), -2, -1, -3).numpy()

ds = LeRobotDataset("robotd/export", root=sys.argv[1])
out = {"len": len(ds), "episodes": ds.num_episodes, "fps": ds.fps, "items": []}
frames = {"top": [], "wrist": []}
for i in range(len(ds)):
    it = ds[i]
    out["items"].append({"state": it["observation.state"].tolist(),
                         "action": it["action"].tolist(), "task": it["task"],
                         "ts": float(it["timestamp"]), "ep": int(it["episode_index"]),
                         "top": list(it["observation.images.top"].shape),
                         "top_mean": float(it["observation.images.top"].mean())})
    for cam in frames:
        frames[cam].append(pixels(it[f"observation.images.{cam}"]))
# windows by time: frames 0.1 s back and the next action, at the dataset's fps
win = LeRobotDataset("robotd/export", root=sys.argv[1], delta_timestamps={
    "observation.images.top": [-0.1, 0.0], "action": [0.0, 1 / 30]})
w = win[45]
out["window"] = {"top": list(w["observation.images.top"].shape),
                 "action": w["action"].tolist(), "pad": w["action_is_pad"].tolist()}
np.savez(sys.argv[2], window=pixels(w["observation.images.top"]),
         **{cam: np.stack(f) for cam, f in frames.items()})
print(json.dumps(out))
"""


def _check_picture(got: np.ndarray, cam: str, e: int, k: int, where: str) -> None:
    """A decoded RGB frame is picture k of episode e's camera: nearer to it than to any
    other picture of the episode (the next differs only by the block's place, 7 px across
    and 3 down), within a lossy codec's error of it (PSNR; mp4v and vp9 give 37-40 dB, the
    next picture about 19), and with its colours in place (per-channel means; swapping red
    and blue moves episode 1's by 0.15)."""
    cands = [_image(cam, e, j)[:, :, ::-1].astype(float) for j in range(TICKS // FRAME_EVERY)]
    mse = [float(np.mean((got.astype(float) - c) ** 2)) for c in cands]
    assert int(np.argmin(mse)) == k, (where, cam, e, k, mse)
    assert mse[k] < 255**2 / 10 ** (28 / 10), (where, cam, e, k, mse[k])  # PSNR over 28 dB
    means = got.mean((0, 1)) / 255
    assert means == pytest.approx(cands[k].mean((0, 1)) / 255, abs=0.03), (where, cam, e, k)


@pytest.mark.skipif(not LEROBOT_PYTHON, reason="ROBOTD_LEROBOT_PYTHON names no python with "
                    "lerobot installed (see docs/trace.md for making one)")
@pytest.mark.parametrize("codec", ["mp4v", "vp9"])
def test_lerobot_loader_reads_the_export(tmp_path, codec):
    out = tmp_path / "ds"
    export_lerobot([record(tmp_path / "runs")], out, codec=codec)
    info = json.loads((out / "meta/info.json").read_text())
    name = {"mp4v": "mpeg4", "vp9": "vp9"}[codec]
    assert info["features"]["observation.images.top"]["info"]["video.codec"] == name
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    pictures = tmp_path / "pictures.npz"
    proc = subprocess.run([LEROBOT_PYTHON, "-c", _LOADER, str(out), str(pictures)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    decoded = np.load(pictures)
    assert (got["len"], got["episodes"], got["fps"]) == (80, 2, 30)
    for i, item in enumerate(got["items"]):
        e, s = divmod(i, TICKS)
        assert item["ep"] == e and item["task"] == f"task {e % 2}"
        assert item["state"] == pytest.approx(np.float32(tick(s)["pos"]).tolist())
        assert item["action"] == pytest.approx(np.float32(_expected_action(s)).tolist())
        assert item["ts"] == pytest.approx(s / 30, abs=1e-6)
        assert item["top"] == [3, H, W]
        want = _image("top", e, s // FRAME_EVERY)[:, :, ::-1].mean() / 255
        assert item["top_mean"] == pytest.approx(want, abs=0.02)
        for cam in ("top", "wrist"):
            _check_picture(decoded[cam][i], cam, e, s // FRAME_EVERY, f"item {i}")
    win = got["window"]  # item 45: episode 1, step 5
    assert win["top"] == [2, 3, H, W] and win["pad"] == [False, False]
    want = np.float32([_expected_action(s) for s in (5, 6)])
    assert np.allclose(win["action"], want)
    for j, s in enumerate((2, 5)):  # 0.1 s back is step 2 (picture 1), now is step 5 (2)
        _check_picture(decoded["window"][j], "top", 1, s // FRAME_EVERY, "window")


def test_cli_export(tmp_path):
    run = record(tmp_path / "runs", episodes=1)
    argv = [sys.executable, "-m", "robotd", "export", str(run / "episode-000001.mcap"),
            "--lerobot", str(tmp_path / "ds")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1 episode, 40 frames at 30 fps, cameras: top, wrist (mpeg4)" in proc.stdout


def test_export_names_a_bad_tick(tmp_path, capsys):
    store = TraceStore(tmp_path / "runs", 1 << 30, CONFIG)
    ep = store.begin_episode(1, "w1", None)
    ep.write("/robot/tick", 1, tick(0))
    ep.write("/robot/tick", 2, tick(1) | {"pos": [1.0, "up", 2.0]})
    ep.end("stopped")
    store.close()
    assert export_main([str(store.run_dir), "--lerobot", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert "episode-000001.mcap: tick 1: pos holds str" in err


def test_rows_of_skipped_steps_are_counted_and_warned(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="robotd"):
        export_lerobot([record(tmp_path / "runs", episodes=1)], tmp_path / "ds")
    said = [r.getMessage() for r in caplog.records if "overrun skipped" in r.getMessage()]
    assert len(said) == 1 and "4 of its 40 rows" in said[0] and "first at frame 0" in said[0]


def test_an_output_that_cannot_be_made_is_named_not_its_temporary(tmp_path):
    run = record(tmp_path / "runs", episodes=1)
    with pytest.raises(ExportError) as err:
        export_lerobot([run], Path("/proc/robotd-no-such/ds"))
    assert str(err.value).startswith("/proc/robotd-no-such/ds: cannot be made there")
    assert "partial" not in str(err.value)


def test_statistics_samples_stay_small_and_bounded():
    from robotd.trace import lerobot

    img = np.full((1080, 1920, 3), 77, np.uint8)
    small = lerobot._stats_sample(img)
    assert max(small.shape[:2]) <= 2 * lerobot.STATS_SIDE and (small == 77).all()
    samples = [small] * (lerobot.MAX_SAMPLES + 1)
    lerobot._thin(samples)
    assert len(samples) <= lerobot.MAX_SAMPLES // 2 + 1
