"""A camera process's log lines read like the daemon's own: time, level, logger, message
(robotd.runtime.procutil.setup_logging's format), so that they sort and filter with
every other line of a run. The real camera process alone, and under the real daemon."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.daemon_util import REPO, Daemon

# the daemon's format: "%(asctime)s %(levelname)s %(name)s: %(message)s"
LINE = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) (?P<name>[\w.]+): (?P<text>.*)$"
CAMERA = "robotd.runtime.camera_proc"


def test_a_camera_process_alone_logs_in_the_daemons_format() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", CAMERA, '{"name": "top", "driver": '], cwd=REPO,
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    m = re.match(LINE, line)
    assert m is not None, line
    assert (m["level"], m["name"]) == ("ERROR", CAMERA), line
    assert m["text"].startswith("camera <unknown>: bad json spec"), line


def test_under_the_daemon_its_lines_read_like_the_daemons(tmp_path: Path) -> None:
    bogus = tmp_path / "cam.mp4"
    bogus.write_text("not a video, only named like one\n")
    text = (REPO / "config" / "sim.toml").read_text()
    text = text.replace('start = "episode"', 'start = "idle"')  # a real camera: no self-start
    text = text.replace('[cameras.top]\ndriver = "sim"', '[cameras.top]\ndriver = "opencv"')
    text = text.replace('view = "top"', f"source = {json.dumps(str(bogus))}")
    config = tmp_path / "robot.toml"
    config.write_text(text)
    d = Daemon(tmp_path, "--config", str(config), "--duration", "3")
    assert d.wait_exit(timeout=120) == 0
    log = d.wait_eof()
    camera = [ln.rstrip("\n") for ln in log if CAMERA in ln]
    assert camera, "".join(log)
    for line in camera:
        m = re.match(LINE, line)
        assert m is not None and m["name"] == CAMERA, line
        assert m["level"] in ("INFO", "WARNING", "ERROR"), line
    assert any(re.match(LINE, ln) and "camera 'top': cannot open: file " in ln for ln in camera)
    daemon = [ln for ln in log if " robotd: " in ln or " robotd.link: " in ln]
    assert daemon and all(re.match(LINE, ln.rstrip("\n")) for ln in daemon)  # the same format
