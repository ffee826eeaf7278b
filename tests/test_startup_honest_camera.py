"""An OpenCV camera source that can never work: refused by `robotd check` naming the key;
at run time said once (with the key and the cause), not once a second for good.

Real OpenCV on real files: a small video written with cv2.VideoWriter, a text file
named .mp4 (FFmpeg: "moov atom not found"), a file and a /dev path that do not exist."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from robotd.shm import FrameRing, unlink_prefix
from tests.daemon_util import REPO, Daemon
from tests.lines_util import at

W, H = 64, 48


def write_video(path: Path, frames: int = 10) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (W, H))
    assert writer.isOpened()
    for i in range(frames):
        writer.write(np.full((H, W, 3), (20 * i) % 256, np.uint8))
    writer.release()
    return path


def text_mp4(path: Path) -> Path:
    path.write_text("not a video, only named like one\n")
    return path


def opencv_config(tmp: Path, source: str) -> Path:
    """config/sim.toml with its top camera an OpenCV one reading `source`."""
    text = (REPO / "config" / "sim.toml").read_text()
    text = text.replace('start = "episode"', 'start = "idle"')  # a real camera: no self-start
    text = text.replace('[cameras.top]\ndriver = "sim"', '[cameras.top]\ndriver = "opencv"')
    text = text.replace('view = "top"', f"source = {json.dumps(source)}")
    path = tmp / "robot.toml"
    path.write_text(text)
    return path


def check(config: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    run_dir = f'runtime.dir="{config.parent}/run"'
    argv = [sys.executable, "-m", "robotd", "check", "--config", str(config), "--set", run_dir]
    argv += [a for s in sets for a in ("--set", s)]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_check_refuses_a_source_that_can_never_deliver(tmp_path: Path) -> None:
    cases = {
        str(tmp_path / "missing.mp4"): "no such file",
        str(text_mp4(tmp_path / "text.mp4")): "cannot be opened (moov atom not found)",
        "/dev/video-robotd-test-absent": "no such device",
    }
    for source, why in cases.items():
        config = opencv_config(tmp_path, source)
        out = check(config)
        assert out.returncode == 2, (source, out.stdout[-300:])
        top = at(config, "source =", "[cameras.top")
        assert f"robotd: {top}: cameras.top.options.source: {source}: {why}\n" == out.stderr
    good = str(write_video(tmp_path / "good.mp4"))
    assert check(opencv_config(tmp_path, good)).returncode == 0
    # A relative path is a file beside the config; a --set is named as the source.
    assert check(opencv_config(tmp_path, "good.mp4")).returncode == 0
    out = check(opencv_config(tmp_path, good), 'cameras.top.options.source="nope.mp4"')
    assert out.stderr.startswith("robotd: --set cameras.top.options.source: ")
    assert out.stderr.endswith(f"{tmp_path / 'nope.mp4'}: no such file\n")
    # With a fallback that works, a missing source is what the fallback is for.
    out = check(
        opencv_config(tmp_path, good),
        'cameras.top.options={source="/dev/video-x", fallback="pattern"}',
    )
    assert out.returncode == 0, out.stderr


@pytest.fixture
def ring() -> Iterator[FrameRing]:
    prefix = f"robotd-test-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    ring = FrameRing.create(prefix + "top", (H, W, 3), 8)
    yield ring
    ring.close()
    unlink_prefix(prefix)


class Lines:
    """A process's stderr, read line by line on a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.log = proc, []
        self._q: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            self._q.put(line)
        self._q.put("")

    def wait(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                break
            assert line, f"exited before {text!r}: {''.join(self.log)}"
            if text in line:
                return line
        raise AssertionError(f"no {text!r} within {timeout} s: {''.join(self.log)}")


def camera_process(ring: FrameRing, source: str) -> subprocess.Popen[str]:
    spec = {"name": "top", "driver": "opencv", "width": W, "height": H, "fps": 30,
            "options": {"source": source}, "ring": ring.name}  # fmt: skip
    argv = [sys.executable, "-m", "robotd.runtime.camera_proc", json.dumps(spec)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)


def test_a_source_that_does_not_decode_is_said_once_and_tried_again(
    tmp_path: Path, ring: FrameRing
) -> None:
    source = text_mp4(tmp_path / "cam.mp4")
    proc = camera_process(ring, str(source))
    lines = Lines(proc)
    try:
        said = lines.wait("cannot open")
        assert "cannot be opened (moov atom not found) (cameras.top.options.source)" in said
        with pytest.raises(subprocess.TimeoutExpired):  # tries again at 1 s, 3 s: no exit
            proc.wait(timeout=3.5)
        write_video(tmp_path / "cam.tmp.mp4", 30).rename(source)  # the file becomes good
        tries = int(lines.wait("opened after").split("opened after ")[1].split()[0])
        assert tries >= 2
        deadline = time.monotonic() + 30
        while ring.latest() is None:  # shared memory: nothing to wait on but the ring
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines.log)
            time.sleep(0.01)
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0
    log = "".join(lines.log)
    assert log.count("cannot open") == 1, log
    assert "[mov," not in log, log  # FFmpeg's own line, once per try, is taken in


def test_a_run_names_the_key_once(tmp_path: Path) -> None:
    config = opencv_config(tmp_path, str(text_mp4(tmp_path / "cam.mp4")))
    d = Daemon(tmp_path, "--config", str(config), "--duration", "3")
    assert d.wait_exit(timeout=120) == 0
    log = "".join(d.wait_eof())
    assert log.count("cameras.top.options.source") == 1, log
    assert "camera 'top': cannot open: file " in log and "moov atom not found" in log
    assert not re.search(r"camera:top (exited|killed by)", log) and "[mov," not in log, log
