"""A hung camera process (SIGSTOP mid-episode) makes the robot hold: the log says so once,
naming the camera and how old its newest frame is, and once more when it is fresh again
(how long it was stale) — once per transition, never per tick. The real daemon on the sim,
its top camera's process stopped and continued."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from robotd.operator.client import ControlClient
from tests.daemon_util import Daemon, processes_mentioning

DEADLINE_S = 30.0  # generous: a loaded 2-core machine
STALE = r"WARNING robotd: camera top is stale: its newest frame is (\d+) ms old \(max_age_ms 200\)"
FRESH = r"WARNING robotd: camera top is fresh again after (\d+\.\d) s stale: acts are asked again"
HELD_STEPS = 60  # steps held while stale before the camera runs again: 2 s at 30 Hz


def _camera_pid(d: Daemon, name: str) -> int:
    def cmdline(p: int) -> str:
        return Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")

    (pid,) = [
        p
        for p in processes_mentioning("robotd.runtime.camera_proc")
        if f'"name": "{name}"' in cmdline(p) and f"robotd-{d.proc.pid}-" in cmdline(p)
    ]
    return pid


def _status_until(c: ControlClient, ok, what: str) -> dict:
    """Poll status (the daemon's answer is the event: nothing else tells us) to a deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        st = c.request("status")["result"]
        if ok(st):
            return st
        assert time.monotonic() < deadline, f"status never showed {what}: {st}"
        time.sleep(0.05)


def test_a_hung_camera_is_said_once_stale_and_once_fresh_again(tmp_path: Path) -> None:
    # the holds must not end the episode meanwhile (10 s by default; 100 s here: a loaded machine)
    d = Daemon(tmp_path, "--set", "control.max_hold_steps=3000")
    d.wait_line(r"operator socket", DEADLINE_S)
    c = ControlClient(d.control_endpoint, timeout_s=15)
    _status_until(c, lambda st: st.get("state") == "RUNNING", "RUNNING")
    top = _camera_pid(d, "top")
    before = len(d.log)
    os.kill(top, signal.SIGSTOP)
    try:
        stale = d.wait_line(STALE, DEADLINE_S)
        held = _status_until(c, lambda st: "top" in st["stale_cameras"], "top stale")
        # held for many ticks, each stale: still only the one line
        _status_until(c, lambda st: st["step"] >= held["step"] + HELD_STEPS
                      and "top" in st["stale_cameras"], f"{HELD_STEPS} steps held")
    finally:
        os.kill(top, signal.SIGCONT)
    fresh = d.wait_line(FRESH, DEADLINE_S)
    assert int(re.search(STALE, stale).group(1)) > 200, stale  # older than its max age
    assert float(re.search(FRESH, fresh).group(1)) >= HELD_STEPS / 30 * 0.9, fresh
    c.close()
    d.signal()
    assert d.wait_exit() == 0
    log = d.wait_eof()[before:]
    assert sum("camera top is stale" in line for line in log) == 1, "".join(log[-30:])
    assert sum("camera top is fresh again" in line for line in log) == 1, "".join(log[-30:])
    assert not any("camera wrist is" in line for line in log), "".join(log[-30:])
    assert d.result()["invalid_observations"] >= HELD_STEPS  # it did hold meanwhile
