"""The daemon on the sim, its main process stopped (SIGSTOP) past every bound mid-episode,
then continued (real processes, sockets and trace). While it is stopped the control lane
notices the silence by itself (no death signal comes): FAULT `main_silent`, the robot
holding, then the e-stop, each said on its own log line. After SIGCONT the main process
comes back coherent: status shows the first cause and the e-stop after it, torque off, the
lane still latched (nothing queued meanwhile moves the robot) until clear_fault, and the
log says what happened and for how long."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

from robotd.operator.client import ControlClient
from robotd.trace.reader import read_all
from tests.daemon_util import Daemon, wait_until

DEADLINE_S = 20.0  # generous: a loaded 2-core machine
QUICK = ("--set", "control.main_silent_s=1", "--set", "control.orphan_s=1")


def _episode_file(d: Daemon) -> Path:
    (run,) = [p for p in d.traces.iterdir() if p.is_dir()]
    return run / "episode-000001.mcap"


def test_a_stopped_main_process_holds_then_estops_and_comes_back_latched(tmp_path):
    d = Daemon(tmp_path, *QUICK)
    d.wait_line(r"episode_start", DEADLINE_S * 2)
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        wait_until(lambda: c.request("status")["result"]["step"] >= 15, DEADLINE_S, "steps")
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            # the lane's own lines reach our pipe while its main process is stopped
            d.wait_line(r"ERROR control: nothing from the main process for 1\.\d s "
                        r"\(stopped or hung\?\): FAULT, holding 1 s", DEADLINE_S)
            d.wait_line(r"ERROR control: the main process is still silent: the e-stop is "
                        r"applied", DEADLINE_S)
            # the stimulus: stopped past MAIN_STALL_S (2 s) in all, so that it says so too
            time.sleep(1.0)
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        # both said, in whichever order the two processes write them
        for said in (r"WARNING control: the main process speaks again after \d+\.\d s of "
                     r"silence: the lane stays latched",
                     r"WARNING robotd: the main process was not running for"):
            wait_until(lambda rx=said: any(re.search(rx, line) for line in d.log), DEADLINE_S,
                       said)

        def settled() -> bool:  # what the lane said since it heard from main again
            st = c.request("status")["result"]
            return st["torque"] is False and (st["fault"] or {}).get("present") == ""

        wait_until(settled, DEADLINE_S, "torque off (category 1), main_silent gone, in status")
        st = c.request("status")["result"]
        assert st["state"] == "FAULT" and st["outcome"] == "fault", st
        fault = st["fault"]
        assert fault["cause"] == "main_silent" and fault["latest_cause"] == "estop", fault
        assert st["lane_silent"] is False
        # latched: what was in flight or queued when it stopped moves nothing
        time.sleep(0.5)  # the stimulus: time for anything stale to fire; not a synchronisation
        assert c.request("status")["result"]["state"] == "FAULT"
        assert c.request("clear_fault")["result"]["state"] == "IDLE"
    finally:
        c.close()
    d.signal(signal.SIGTERM)
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    sidecar = json.loads(_episode_file(d).with_suffix(".json").read_text())
    assert sidecar["outcome"] == "fault" and sidecar["cause"] == "main_silent", sidecar
    ticks = [m.record for m in read_all(_episode_file(d))[0] if m.topic == "/robot/tick"]
    # held through the silence: the queue ran out and nothing new was played up to the fault
    tail = ticks[-15:]  # the last 0.5 s of the 1 s of silence before the fault
    assert all(t["held"] for t in tail), [t["held"] for t in tail]
    assert len({json.dumps(t["target"]) for t in tail}) == 1, tail
    assert "Traceback" not in "".join(d.log)
