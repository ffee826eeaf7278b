"""`robotd check` refuses an OpenCV camera source that can never deliver beyond files and
/dev paths: a device index whose /dev/videoN does not exist (unless the fallback serves),
and a stream URL that is malformed or of a scheme OpenCV does not open. Nothing is
connected to. Real OpenCV, a real /dev, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from drivers.opencv.options import source_problem
from robotd.cli import main
from robotd.config import DEFAULT_CONFIG, load
from tests.lines_util import at

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/dev/videoN is Linux's")


def opencv_config(tmp: Path, source: object, **options: object) -> Path:
    """config/sim.toml with its top camera an OpenCV one reading `source`."""
    text = DEFAULT_CONFIG.read_text().replace('start = "episode"', 'start = "idle"')
    text = text.replace('[cameras.top]\ndriver = "sim"', '[cameras.top]\ndriver = "opencv"')
    given = {"source": source, **options}
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in given.items())
    text = text.replace('view = "top"', lines)
    path = tmp / "robot.toml"
    path.write_text(text)
    return path


def check(config: Path, capsys: pytest.CaptureFixture[str], *sets: str) -> tuple[int, str]:
    argv = ["check", "--config", str(config), "--set", f'runtime.dir="{config.parent}/run"']
    code = main([*argv, *(a for s in sets for a in ("--set", s))])
    return code, capsys.readouterr().err


def absent_index() -> int:
    return next(n for n in range(64) if not Path(f"/dev/video{n}").exists())


def write_video(path: Path) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (64, 48))
    assert writer.isOpened()
    for i in range(5):
        writer.write(np.full((48, 64, 3), 40 * i, np.uint8))
    writer.release()
    return path


@linux
def test_a_device_index_with_no_device_is_refused_naming_its_path(tmp_path, capsys):
    n = absent_index()
    config = opencv_config(tmp_path, n)
    top = at(config, "source =", "[cameras.top")
    assert check(config, capsys) == (
        2,
        f"robotd: {top}: cameras.top.options.source: {n}: no such device (/dev/video{n})\n",
    )
    code, err = check(config, capsys, f"cameras.top.options.source={n}")
    assert code == 2 and err.startswith(f"robotd: --set cameras.top.options.source: {n}: no such")


@linux
@pytest.mark.skipif(Path("/dev/video0").exists(), reason="the default source is device 0")
def test_a_camera_a_set_made_is_blamed_on_that_set_not_the_file(tmp_path, capsys):
    # The file has no camera "extra": the first --set made its table, whose default source
    # (device 0) names no device. The key is the file's no more than the --set's own.
    config = opencv_config(tmp_path, "rtsp://cam/s")
    made = ('cameras.extra.driver="opencv"', "cameras.extra.width=64")
    code, err = check(config, capsys, *made, "cameras.extra.height=48", "cameras.extra.fps=10")
    assert (code, err) == (
        2,
        'robotd: --set cameras.extra.driver: cameras.extra.options.source: 0: no such device '
        "(/dev/video0)\n",
    )


@linux
def test_a_missing_device_index_is_what_a_fallback_is_for(tmp_path, capsys):
    n = absent_index()
    assert check(opencv_config(tmp_path, n, fallback="pattern"), capsys)[0] == 0
    good = write_video(tmp_path / "good.mp4")
    assert check(opencv_config(tmp_path, n, fallback=str(good)), capsys)[0] == 0
    code, err = check(opencv_config(tmp_path, n, fallback="gone.mp4"), capsys)
    assert code == 2
    assert err.endswith(f"; and fallback: {tmp_path / 'gone.mp4'}: no such file\n")


def test_check_is_given_the_options_the_load_validated(tmp_path):
    # what `robotd check` hands each camera's preflight: the load's own, not validated again
    from drivers.opencv.camera import OpenCVOptions

    config = opencv_config(tmp_path, "rtsp://cam/s", fallback="pattern")
    loaded = load(config, ["cameras.top.options.backend=\"ffmpeg\""])
    top = loaded.camera_options["top"]
    assert isinstance(top, OpenCVOptions)
    assert (top.source, top.fallback, top.backend) == ("rtsp://cam/s", "pattern", "ffmpeg")
    assert loaded.camera_options["wrist"] is not None  # a sim camera: its own model
    assert loaded.blame("cameras.top.options.backend") == "--set cameras.top.options.backend"
    top = at(config, "source =", "[cameras.top")
    assert loaded.blame("cameras.top.options.source") == f"{top}: cameras.top.options.source"


def test_a_device_index_that_exists_is_taken(tmp_path):
    from drivers.opencv.camera import OpenCVOptions

    (tmp_path / "video3").touch()
    assert source_problem(OpenCVOptions(source=3), tmp_path, devices=tmp_path) is None
    assert source_problem(OpenCVOptions(source=4), tmp_path, devices=tmp_path) == (
        f"source: 4: no such device ({tmp_path / 'video4'})"
    )
    # 200 with backend any is OpenCV's spelling of V4L2's device 0: not ours to judge
    assert source_problem(OpenCVOptions(source=200), tmp_path, devices=tmp_path) is None


def test_the_drivers_preflight_holds_the_url_and_index_rules(tmp_path):
    from drivers.opencv.camera import OpenCVCamera, OpenCVOptions

    bad = OpenCVCamera.preflight(OpenCVOptions(source="rstp://cam/s"), tmp_path)
    assert bad is not None and bad.startswith("source: rstp://cam/s: scheme 'rstp' is not one")
    assert OpenCVCamera.preflight(OpenCVOptions(source="rtsp://cam/s"), tmp_path) is None
    if sys.platform.startswith("linux") and not Path("/dev/video63").exists():
        gone = OpenCVCamera.preflight(OpenCVOptions(source=63), tmp_path)
        assert gone == "source: 63: no such device (/dev/video63)"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("rtsp://", "no host in the URL (rtsp:// needs a host)"),
        ("rtsp:///stream", "no host in the URL (rtsp:// needs a host)"),
        ("http://:8080/video", "no host in the URL (http:// needs a host)"),
        ("udp://", "no host in the URL (udp:// needs a host or a port)"),
        ("rtsp://cam:99999/s", "a bad port (Port out of range 0-65535)"),
        ("rtsp://cam /s", "a URL has no blanks"),
        ("rstp://cam/s", "scheme 'rstp' is not one OpenCV opens (rtsp, rtsps, http, https"),
        ("ws://cam/s", "scheme 'ws' is not one OpenCV opens"),
    ],
)
def test_a_malformed_stream_url_is_refused(tmp_path, capsys, url, why):
    config = opencv_config(tmp_path, url, fallback="pattern")  # a typo, not an absent camera
    code, err = check(config, capsys)
    assert code == 2
    top = at(config, "source =", "[cameras.top")
    assert err.startswith(f"robotd: {top}: cameras.top.options.source: {url}: {why}"), err


@pytest.mark.parametrize(
    "url",
    [
        "rtsp://user:secret@cam.local:554/stream1",
        "rtsps://cam.local/s",
        "http://192.0.2.7:8080/video.mjpg",
        "https://[2001:db8::1]/live",
        "udp://@:5000",
        "udp://239.0.0.1:1234",
        "tcp://cam:8554",
        "rtmp://cam/live/key",
    ],
)
def test_a_well_formed_stream_url_is_taken_without_connecting(tmp_path, capsys, url):
    # None of these hosts answers: a check that connected would fail or hang.
    assert check(opencv_config(tmp_path, url), capsys) == (0, "")


def test_a_file_url_is_checked_as_the_file(tmp_path, capsys):
    good = write_video(tmp_path / "good.mp4")
    assert check(opencv_config(tmp_path, f"file://{good}"), capsys)[0] == 0
    code, err = check(opencv_config(tmp_path, f"file://{tmp_path}/nope.mp4"), capsys)
    assert code == 2 and err.endswith(f"source: file://{tmp_path}/nope.mp4: no such file\n")


def test_a_password_in_a_refused_url_is_not_printed(tmp_path, capsys):
    code, err = check(opencv_config(tmp_path, "rstp://admin:hunter2@cam/s"), capsys)
    assert code == 2 and "hunter2" not in err and "rstp://admin:***@cam/s" in err


def test_check_refuses_a_bad_url_in_one_line_without_a_traceback(tmp_path):
    config = opencv_config(tmp_path, "rtsp://")
    argv = [sys.executable, "-m", "robotd", "check", "--config", str(config)]
    argv += ["--set", f'runtime.dir="{tmp_path}/run"']
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    top = at(config, "source =", "[cameras.top")
    assert done.stderr.splitlines() == [
        f"robotd: {top}: cameras.top.options.source: rtsp://: no host in the URL (rtsp:// "
        "needs a host)"
    ]
