"""The control lane maps no OpenCV. It runs no camera, but it validated the config it was
handed, and the camera drivers' modules import cv2: ~140 MB of mappings its mlockall then
locked (bench/tick.py's VmLck 267 MB against its 120 MB target). A real daemon on the sim
config (cameras on): the control process's own memory map is read."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from tests.daemon_util import Daemon, processes_mentioning


def test_the_control_process_of_a_daemon_with_cameras_maps_no_opencv(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    try:
        d.wait_line(r"operator socket")
        lanes = [p for p in processes_mentioning("robotd.control.process")
                 if str(d.dir) in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
        assert len(lanes) == 1, lanes
        maps = Path(f"/proc/{lanes[0]}/maps").read_text()
        assert "cv2" not in maps and "opencv" not in maps
        prefix = re.search(r'"shm_prefix": ?"([^"]+)"',
                           Path(f"/proc/{lanes[0]}/cmdline").read_text(errors="replace"))
        assert prefix is not None
        cameras = [p for p in processes_mentioning("robotd.runtime.camera_proc")
                   if prefix[1] in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
        assert cameras  # the cameras do run, in their own processes
    finally:
        d.signal(signal.SIGINT)
        assert d.wait_exit() == 0
