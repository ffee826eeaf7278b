"""Episodes written as a LeRobot dataset, format v3.0.

The layout (LeRobot's ``datasets/utils.py`` and its v3 documentation):

    meta/info.json                      codebase_version "v3.0", fps, features, path templates
    meta/stats.json                     per feature: min max mean std count q01 q10 q50 q90 q99
    meta/tasks.parquet                  index ``task`` (the text) → column ``task_index``
    meta/episodes/chunk-000/file-000.parquet   one row per episode: length, tasks, where
                                        its rows and videos are (data/…, videos/<key>/…,
                                        dataset_from_index/to_index, from/to_timestamp)
    data/chunk-CCC/file-FFF.parquet     one row per tick: observation.state, action,
                                        timestamp, frame_index, episode_index, index, task_index
    videos/<key>/chunk-CCC/file-FFF.mp4 one video per camera (key observation.images.<cam>)

Here every episode gets its own data file and video file (file index = episode index, a
new chunk every 1000): the layout allows it, and LeRobot finds them through the
episodes table. robotd adds its own columns to that table: ``robotd/outcome``, ``robotd/cause``,
``robotd/success``, ``robotd/notes``, ``robotd/run``, ``robotd/episode``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robotd.trace.episode_data import EpisodeData, camera_frames
from robotd.trace.video import VideoError, frames_at_ticks, write_video

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)


@dataclass(frozen=True)
class DatasetSummary:
    root: Path
    episodes: int
    frames: int
    fps: int
    cameras: list[str]
    codec: str


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise RuntimeError("robotd export needs pyarrow: pip install 'robotd[export]'") from None
    return pa, pq


def _stats(x: np.ndarray) -> dict[str, Any]:
    """LeRobot's statistics of an (N, D) array (or (N,) for a scalar feature)."""
    out = {
        "min": x.min(0),
        "max": x.max(0),
        "mean": x.mean(0),
        "std": x.std(0),
        "count": np.array([len(x)]),
    }
    for q in QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(x, q, axis=0)
    return {k: np.atleast_1d(v).tolist() for k, v in out.items()}


STATS_SIDE = 150  # sampled frames are shrunk to about this many pixels a side, as LeRobot's
MAX_SAMPLES = 1000  # per camera for the dataset's statistics; thinned evenly past it


def _stats_sample(img: np.ndarray) -> np.ndarray:
    """A frame shrunk for statistics (area filter: the means hold), so that an export of
    many high-resolution episodes keeps kilobytes a sample, not megabytes."""
    import cv2

    h, w = img.shape[:2]
    k = max(1, round(max(h, w) / STATS_SIDE))
    if k == 1:
        return img.copy()
    return cv2.resize(img, (max(1, w // k), max(1, h // k)), interpolation=cv2.INTER_AREA)


def _thin(samples: list[np.ndarray]) -> None:
    """Keep every other sample once there are MAX_SAMPLES (the dataset's stay bounded)."""
    if len(samples) > MAX_SAMPLES:
        del samples[1::2]


def _image_stats(samples: list[np.ndarray]) -> dict[str, Any]:
    """Per-channel statistics of sampled RGB frames in 0..1, shaped (3, 1, 1) as LeRobot's."""
    x = np.stack([s[:, :, ::-1] for s in samples]).astype(np.float32) / 255.0  # BGR → RGB
    x = x.transpose(0, 3, 1, 2)  # N C H W
    red = (0, 2, 3)
    out = {"min": x.min(red), "max": x.max(red), "mean": x.mean(red), "std": x.std(red)}
    for q in QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(x, q, axis=red)
    stats = {k: v.reshape(3, 1, 1).tolist() for k, v in out.items()}
    stats["count"] = [len(samples)]
    return stats


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _location(index: int) -> tuple[int, int]:
    return divmod(index, CHUNKS_SIZE)


def features(joints: list[str], cameras: dict[str, tuple[int, int, str]], fps: int) -> dict:
    """The info.json features: state and action named by joint, one video per camera."""
    n = len(joints)
    feats: dict[str, Any] = {
        "observation.state": {"dtype": "float32", "shape": [n], "names": joints},
        "action": {"dtype": "float32", "shape": [n], "names": joints},
    }
    for cam, (w, h, codec) in cameras.items():
        feats[f"observation.images.{cam}"] = {
            "dtype": "video",
            "shape": [h, w, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": h,
                "video.width": w,
                "video.codec": codec,
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": fps,
                "video.channels": 3,
                "has_audio": False,
            },
        }
    for key, dtype in (
        ("timestamp", "float32"),
        ("frame_index", "int64"),
        ("episode_index", "int64"),
        ("index", "int64"),
        ("task_index", "int64"),
    ):
        feats[key] = {"dtype": dtype, "shape": [1], "names": None}
    return feats


class DatasetWriter:
    """Writes episodes one by one into `root` (an empty directory), then the metadata."""

    def __init__(
        self,
        root: Path,
        fps: int,
        joints: list[str],
        cameras: list[str],
        codec: str = "mp4v",
        robot_type: str | None = None,
    ) -> None:
        self.pa, self.pq = _pa()
        self.root, self.fps, self.joints, self.cameras = root, fps, joints, cameras
        self.codec, self.robot_type = codec, robot_type
        self.tasks: dict[str, int] = {}
        self.rows: list[dict[str, Any]] = []
        self.frames = 0
        self.video_shapes: dict[str, tuple[int, int, str]] = {}
        self.all_state: list[np.ndarray] = []
        self.all_action: list[np.ndarray] = []
        self.samples: dict[str, list[np.ndarray]] = {c: [] for c in cameras}

    def add(self, ep: EpisodeData) -> None:
        index = len(self.rows)
        n = ep.ticks
        task = str(ep.meta.get("task") or "")
        task_index = self.tasks.setdefault(task, len(self.tasks))
        chunk, file = _location(index)
        self._write_data(ep, index, task_index, chunk, file)
        row: dict[str, Any] = {
            "episode_index": index,
            "tasks": [task],
            "length": n,
            "data/chunk_index": chunk,
            "data/file_index": file,
            "dataset_from_index": self.frames,
            "dataset_to_index": self.frames + n,
        }
        for cam in self.cameras:
            row |= self._write_video(ep, cam, chunk, file)
        row |= {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
        for key, x in (("observation.state", ep.state), ("action", ep.action)):
            for stat, value in _stats(x).items():
                row[f"stats/{key}/{stat}"] = value
        verdict = ep.verdict if isinstance(ep.verdict, dict) else {}
        success = verdict.get("success")
        row |= {
            "robotd/outcome": ep.outcome,
            "robotd/cause": ep.cause,
            "robotd/success": success if isinstance(success, bool) else None,
            "robotd/notes": str(verdict.get("notes") or ""),
            "robotd/run": str(ep.meta.get("run") or ""),
            "robotd/episode": _int(ep.meta.get("episode")),
            # rows of steps an overrun skipped: they repeat the last observation and action
            "robotd/skipped": int(ep.skipped.sum()),
        }
        self.rows.append(row)
        self.frames += n
        self.all_state.append(ep.state)
        self.all_action.append(ep.action)

    def _write_data(
        self, ep: EpisodeData, index: int, task_index: int, chunk: int, file: int
    ) -> None:
        pa, n, j = self.pa, ep.ticks, len(self.joints)

        def vectors(x: np.ndarray) -> Any:
            flat = pa.array(x.astype(np.float32).reshape(-1), type=pa.float32())
            return pa.FixedSizeListArray.from_arrays(flat, j)

        table = pa.table(
            {
                "observation.state": vectors(ep.state),
                "action": vectors(ep.action),
                "timestamp": pa.array((np.arange(n) / self.fps).astype(np.float32)),
                "frame_index": pa.array(np.arange(n, dtype=np.int64)),
                "episode_index": pa.array(np.full(n, index, dtype=np.int64)),
                "index": pa.array(np.arange(self.frames, self.frames + n, dtype=np.int64)),
                "task_index": pa.array(np.full(n, task_index, dtype=np.int64)),
            }
        )
        path = self.root / DATA_PATH.format(chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.pq.write_table(table, path, compression="snappy")

    def _write_video(self, ep: EpisodeData, cam: str, chunk: int, file: int) -> dict[str, Any]:
        key = f"observation.images.{cam}"
        path = self.root / VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
        sample_every = max(1, ep.ticks // 50)
        mine: list[np.ndarray] = []  # this episode's samples: its own stats, and the dataset's

        def sampled():
            shown = frames_at_ticks(camera_frames(ep.path, cam), ep.log_time, ep.refs.get(cam))
            for i, img in enumerate(shown):
                if i % sample_every == 0:
                    mine.append(_stats_sample(img))
                yield img

        info = write_video(path, sampled(), self.fps, self.codec)
        shape = (info.width, info.height, info.codec)
        kept = self.video_shapes.setdefault(key, shape)
        if kept != shape:
            # export_lerobot compares the sizes before encoding (ExportError); this guards
            # a writer used on its own. The stored size is the earlier episodes'.
            raise VideoError(
                f"{ep.path}: camera {cam} is {info.width}x{info.height}, "
                f"the dataset's earlier episodes' are {kept[0]}x{kept[1]}"
            )
        self.samples[cam].extend(mine)
        _thin(self.samples[cam])
        row = {
            f"videos/{key}/chunk_index": chunk,
            f"videos/{key}/file_index": file,
            f"videos/{key}/from_timestamp": 0.0,
            f"videos/{key}/to_timestamp": info.frames / self.fps,
        }
        if mine:  # per episode as LeRobot keeps them: what merging datasets aggregates
            row |= {f"stats/{key}/{k}": v for k, v in _image_stats(mine).items()}
        return row

    def finish(self) -> DatasetSummary:
        pa, pq, meta = self.pa, self.pq, self.root / "meta"
        (meta / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(self.rows), self.root / EPISODES_PATH)
        self._write_tasks(meta / "tasks.parquet")
        cams = {k.removeprefix("observation.images."): v for k, v in self.video_shapes.items()}
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": len(self.rows),
            "total_frames": self.frames,
            "total_tasks": len(self.tasks),
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.fps,
            "splits": {"train": f"0:{len(self.rows)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if cams else None,
            "features": features(self.joints, cams, self.fps),
        }
        (meta / "info.json").write_text(json.dumps(info, indent=4) + "\n")
        stats = {
            "observation.state": _stats(np.concatenate(self.all_state)),
            "action": _stats(np.concatenate(self.all_action)),
        }
        for cam, samples in self.samples.items():
            if samples:
                stats[f"observation.images.{cam}"] = _image_stats(samples)
        (meta / "stats.json").write_text(json.dumps(stats, indent=4) + "\n")
        codec = next(iter(self.video_shapes.values()))[2] if self.video_shapes else ""
        return DatasetSummary(self.root, len(self.rows), self.frames, self.fps, list(cams), codec)

    def _write_tasks(self, path: Path) -> None:
        """tasks.parquet as pandas writes it: the text as the index named ``task``, so
        LeRobot's ``pd.read_parquet`` finds each task_index by its text."""
        pa = self.pa
        names = list(self.tasks)
        table = pa.table(
            {
                "task_index": pa.array([self.tasks[t] for t in names], pa.int64()),
                "task": pa.array(names, pa.string()),
            }
        )
        pandas_meta = {
            "index_columns": ["task"],
            "column_indexes": [
                {
                    "name": None,
                    "field_name": None,
                    "pandas_type": "unicode",
                    "numpy_type": "object",
                    "metadata": {"encoding": "UTF-8"},
                }
            ],
            "columns": [
                {
                    "name": "task_index",
                    "field_name": "task_index",
                    "pandas_type": "int64",
                    "numpy_type": "int64",
                    "metadata": None,
                },
                {
                    "name": "task",
                    "field_name": "task",
                    "pandas_type": "unicode",
                    "numpy_type": "object",
                    "metadata": None,
                },
            ],
            "creator": {"library": "pyarrow", "version": pa.__version__},
            "pandas_version": "2.2.0",
        }
        table = table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
        self.pq.write_table(table, path)
