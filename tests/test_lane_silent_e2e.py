"""The daemon on the sim with its control process stopped (SIGSTOP): status, stats and
watch say the lane is silent instead of showing its last state as live, robotctl exits
1, the daemon logs the silence once and, after SIGCONT, how long it lasted. A stopped
main process is not mistaken for a silent lane."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable

import pytest

from robotd.operator.client import ControlClient
from robotd.operator.robotctl import EXIT_ERROR, EXIT_OK
from tests.daemon_util import Daemon, lane_pid
from tests.robotctl_util import PtyWatch, robotctl

DEADLINE_S = 20.0  # generous: a loaded 2-core machine
SILENT = "control lane silent for"


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("silent"), "--set", 'robot.start="latched"')
    d.wait_line(r"operator socket")
    c = ControlClient(d.control_endpoint, timeout_s=15)
    assert c.request("clear_fault")["result"]["state"] == "IDLE"
    assert c.request("start")["result"]["state"] == "RUNNING"
    yield d, c
    c.close()
    d.signal()
    assert d.wait_exit() == 0


def _status_until(client: ControlClient, ok: Callable[[dict], bool], what: str) -> dict:
    """Poll status (the daemon's answer is the event: nothing else tells us) to a deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        st = client.request("status")["result"]
        if ok(st):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"status never showed {what} within {DEADLINE_S} s: {st}")
        time.sleep(0.1)


def _ctl(daemon: Daemon, *args: str):
    out, _ = robotctl(*args, "--timeout", "15", env={"ROBOTD_ENDPOINT": daemon.control_endpoint})
    return out


def test_a_stopped_main_process_is_not_called_a_silent_lane(running):
    daemon, client = running
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(3.0)  # the stimulus: longer than the bound (2.1 s); not a synchronisation
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    _status_until(client, lambda st: st["lane_age_s"] < 1.0, "the lane's messages read")
    # A negative: watched for two bounds after the resume (the silence watch runs four
    # times a bound), the lane is never called silent and nothing says it was.
    end = time.monotonic() + 2 * client.request("status")["result"]["lane_silent_after_s"]
    while time.monotonic() < end:
        assert client.request("status")["result"]["lane_silent"] is False
        time.sleep(0.1)
    assert not any(SILENT in line for line in daemon.log), "".join(daemon.log[-20:])
    assert _ctl(daemon, "status").returncode == EXIT_OK


def test_a_stopped_lane_is_shown_silent_logged_and_its_return_too(running):
    daemon, client = running
    assert client.request("status")["result"]["lane_silent"] is False
    lane = lane_pid(daemon)
    w = PtyWatch("--endpoint", daemon.control_endpoint)
    try:
        w.read_until(r"RUNNING")
        os.kill(lane, signal.SIGSTOP)
        try:
            st = _status_until(client, lambda st: st.get("lane_silent") is True, "silence")
            assert st["state"] == "RUNNING" and st["lane_age_s"] > st["lane_silent_after_s"]
            line = daemon.wait_line(SILENT, timeout=DEADLINE_S)
            assert f"pid {lane}" in line and "last state RUNNING episode 1 step" in line
            human = _ctl(daemon, "status")
            assert human.returncode == EXIT_ERROR, human.stderr
            assert human.stdout.startswith("state    LANE SILENT "), human.stdout
            assert "s (last: RUNNING episode 1 step " in human.stdout
            js = _ctl(daemon, "status", "--json")
            assert js.returncode == EXIT_ERROR and json.loads(js.stdout)["lane_silent"] is True
            stats = _ctl(daemon, "stats")
            first = stats.stdout.splitlines()[0]  # on top, before the numbers it qualifies
            assert stats.returncode == EXIT_ERROR and first.startswith("lane "), stats.stdout
            assert "LANE SILENT " in first and "(last: RUNNING episode 1 step" in first
            w.read_until(r"STALE\s+control lane silent \d+ s \(last: RUNNING episode 1 step")
        finally:
            os.kill(lane, signal.SIGCONT)
    finally:
        assert w.close() == 0
    back = daemon.wait_line(r"control lane speaks again after \d+\.\d s of silence", DEADLINE_S)
    assert float(back.split("after ")[1].split(" s")[0]) >= 2.0
    _status_until(client, lambda st: st["lane_silent"] is False, "the lane heard again")
    assert _ctl(daemon, "status").returncode == EXIT_OK
    assert sum(SILENT in line for line in daemon.log) == 1  # one warning for one silence
    assert "Traceback" not in "".join(daemon.log)
