"""An episode cut by the control lane's death is recorded as that (`lane_lost`, the cause
saying how the lane ended), not as `daemon_stopped`, which says the daemon stopped it
cleanly. A real daemon on the sim config, its real control process killed."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from robotd.operator.robotctl import ControlClient
from robotd.trace.reader import read_all
from robotd.trace.replay import replay
from robotd.trace.schemas import EPISODE_END, EVENTS
from tests.daemon_util import Daemon, lane_pid, wait_until

CAUSE = "the control lane is gone: killed by SIGKILL"


def _running(c: ControlClient) -> bool:
    st = c.request("status")["result"]
    return st.get("state") == "RUNNING" and st["step"] >= 10


def test_an_episode_cut_by_a_killed_control_lane_ends_lane_lost(tmp_path: Path) -> None:
    d = Daemon(tmp_path)  # the sim starts its first episode by itself
    d.wait_line(r"operator socket")
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        wait_until(lambda: _running(c), 30, "an episode 10 steps in")
    finally:
        c.close()
    os.kill(lane_pid(d), signal.SIGKILL)
    d.wait_line(r"control killed by SIGKILL after [\d.]+ s: the control lane is gone")
    assert d.wait_exit() == 1
    (run,) = [p for p in d.traces.iterdir() if p.is_dir()]
    (path,) = sorted(run.glob("episode-*.mcap"))
    side = json.loads(path.with_suffix(".json").read_text())
    assert (side["outcome"], side["cause"]) == ("lane_lost", CAUSE), side
    msgs, reader = read_all(path)
    assert reader.status.complete, reader.status.message  # closed cleanly all the same
    ends = [m.record for m in msgs if m.topic == EVENTS and m.record["name"] == EPISODE_END]
    assert len(ends) == 1, ends
    assert ends[0]["detail"]["outcome"] == "lane_lost", ends
    assert ends[0]["detail"]["cause"] == CAUSE and ends[0]["tick"] is None, ends
    replayed = replay(path)  # what it recorded still replays, up to its last record
    assert replayed.match and replayed.targets > 0, replayed
    assert any("end was not recorded" in note for note in replayed.notes), replayed.notes
