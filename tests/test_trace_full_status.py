"""The trace's disk full mid-episode (a real 5 MB tmpfs mounted for the trace directory,
skipped without the right to mount; unmounted after), through the real daemon: the episode
goes on, the write error is logged once, and status says the trace is NOT recording, why,
and how many of the episode's ticks no file holds, in its JSON and in robotctl's words;
once the disk has room again the next episode records and status says so."""

from __future__ import annotations

import signal

from robotd.operator.client import ControlClient
from tests.daemon_util import Daemon, wait_until
from tests.robotctl_util import robotctl
from tests.test_trace_mend_disk_full import disk, fill

__all__ = ["disk"]  # the fixture: a 5 MB tmpfs
DEADLINE_S = 30.0  # generous: a loaded 2-core machine
CLOSED = r"episode-000001\.mcap: \[Errno 28\] No space left on device; file closed"


def test_status_says_the_trace_stopped_on_a_full_disk_and_the_episode_goes_on(disk, tmp_path):
    fill(disk / "filler", leave=400_000)
    d = Daemon(tmp_path, "--set", f'trace.dir="{disk / "traces"}"')
    d.wait_line(r"operator socket", DEADLINE_S)
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        d.wait_line(CLOSED, DEADLINE_S * 3)
        st = c.request("status")["result"]
        trace = st["trace"]
        assert trace["recording"] is False, trace
        assert trace["refused"]["disk_full"] is True
        assert trace["refused"]["file"] == "episode-000001.mcap", trace
        assert trace["stopped"] == ["episode-000001.mcap"]
        step = st["step"]

        def going_on() -> bool:  # the episode (and the loop) carry on, the loss counted
            now = c.request("status")["result"]
            return now["state"] == "RUNNING" and now["step"] >= step + 30 and (
                now["trace"]["lost_ticks"] > trace["lost_ticks"])

        wait_until(going_on, DEADLINE_S, "the episode to go on, its lost ticks counted")
        said = robotctl("status", "--timeout", "15", env={"ROBOTD_ENDPOINT": d.control_endpoint})[0]
        assert said.returncode == 0, said.stderr
        assert ("trace    NOT recording: disk full (episode-000001.mcap: [Errno 28] No space "
                "left on device); ") in said.stdout, said.stdout
        assert "ticks of this episode lost; the robot carries on" in said.stdout
        (disk / "filler").unlink()
        assert c.request("stop")["ok"] and c.request("reset_done")["ok"]
        assert c.request("start")["ok"]

        def recording_again() -> bool:
            return c.request("status")["result"]["trace"]["recording"] is True

        wait_until(recording_again, DEADLINE_S, "episode 2 recorded")
        assert c.request("status")["result"]["trace"]["stopped"] == ["episode-000001.mcap"]
    finally:
        c.close()
    d.signal(signal.SIGTERM)
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    assert sum("No space left on device; file closed" in line for line in d.log) == 1


def test_trace_words_take_whatever_a_wire_holds() -> None:
    from robotd.operator.words import trace_words

    assert trace_words(None) == "" and trace_words([1]) == ""
    odd = {"recording": "yes", "refused": 3, "stopped": [1, "\x1b[2J"], "lost_ticks": -4,
           "dropped": {"records": True, "frames": 2}}
    words = trace_words(odd)
    assert words.startswith("NOT recording: write error (?)") and "\x1b" not in words
    assert words.endswith("queue full: 0 records, 2 frames dropped"), words
    assert trace_words({"recording": True, "stopped": ["a.mcap"]}) == (
        "recording (write errors closed a.mcap earlier)")
