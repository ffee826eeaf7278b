""""policy worker back" says what actually happens by the lane's state then: an episode
that ended while the worker was away (starved: nothing to play) is not said to go on; a
running one goes on in a new worker-side episode. The real daemon on the sim, its local
worker stopped (SIGSTOP) past the heartbeat, then killed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from robotd.operator.client import ControlClient
from tests.daemon_util import Daemon, processes_mentioning

DEADLINE_S = 60.0  # generous: a loaded 2-core machine


def _worker_pid(d: Daemon) -> int:
    (pid,) = [p for p in processes_mentioning(f"--bind stream+ipc://{d.dir}/worker-")
              if b" serve " in Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")]
    return pid


def _until(c: ControlClient, ok, what: str) -> dict:
    """Poll status (the daemon's answer is the event: nothing else tells us) to a deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not ok(st := c.request("status")["result"]):
        assert time.monotonic() < deadline, f"never {what}: {st}"
        time.sleep(0.05)
    return st


def test_worker_back_says_what_it_acts_on(tmp_path: Path) -> None:
    # 10 s of holds end an episode (starved: the sim's default, longer than a worker's
    # restart takes on a loaded machine); the heartbeat notices a stopped worker in 1 s
    d = Daemon(tmp_path, "--set", "control.max_hold_steps=300", "--set", "policy.heartbeat_s=1")
    d.wait_line(r"operator socket", DEADLINE_S)
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        _until(c, lambda st: st.get("state") == "RUNNING" and st["step"] >= 30, "30 steps")
        worker = _worker_pid(d)
        os.kill(worker, signal.SIGSTOP)
        try:
            d.wait_line(r"policy worker gone: no heartbeat", DEADLINE_S)
            d.wait_line(r"episode_end \{'episode': 1, .*'outcome': 'starved'", DEADLINE_S)
            _until(c, lambda st: st["state"] == "RESETTING", "RESETTING")
        finally:
            os.kill(worker, signal.SIGCONT)
        back = d.wait_line(r"policy worker back after", DEADLINE_S)
        assert back.rstrip().endswith(
            "episode 1 ended while it was away; no episode is running (RESETTING): the next "
            "start (after reset_done) acts on it"), back
        assert "goes on" not in back, back
        # A running episode, the worker killed (it restarts): that one does go on.
        assert c.request("reset_done")["result"]["state"] == "IDLE"
        assert c.request("start")["result"]["state"] == "RUNNING"
        before = _until(c, lambda st: st["episode"] == 2 and st["step"] >= 10, "episode 2")
        assert before["wstep"] == before["step"], before  # one worker-side episode so far
        os.kill(_worker_pid(d), signal.SIGKILL)
        back = d.wait_line(r"policy worker back after", DEADLINE_S)
        assert back.rstrip().endswith("episode 2 goes on in a new worker-side episode"), back
        # status counts the new worker-side episode's steps beside the operator episode's
        _until(c, lambda st: st["wep"] != before["wep"] and 0 < st["wstep"] < st["step"],
               "the new worker-side episode's steps")
    finally:
        c.close()
    d.signal(signal.SIGINT)
    assert d.wait_exit() == 0
