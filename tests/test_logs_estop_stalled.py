"""An e-stop the control lane takes through lane.sock while the main process is stopped is
logged only once the main process runs again, with its own time: the line then says when
the lane took it, and the main process says once that it was not running and how long.
The real daemon on the sim, its main process stopped (SIGSTOP) while `robotctl estop`
falls back to lane.sock."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from robotd.operator.client import ControlClient, estop_via_lane
from tests.daemon_util import Daemon, wait_until

DEADLINE_S = 30.0  # generous: a loaded 2-core machine
STOPPED_S = 4.0  # the main process stays stopped this long after the e-stop
LATE = r"\(taken by the control lane (\d+\.\d) s earlier, while this process was not running\)"
STALL = r"WARNING robotd: the main process was not running for (\d+\.\d) s"


def test_an_estop_taken_while_main_was_stopped_says_when_the_lane_took_it(
    tmp_path: Path,
) -> None:
    # stopped ~4.5 s in all: well under the lane's own bound for a silent main process
    d = Daemon(tmp_path, "--set", "control.main_silent_s=15")
    d.wait_line(r"operator socket", DEADLINE_S)
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            got = estop_via_lane(d.control_endpoint, "while main stopped", 15.0)
            assert got["state"] == "FAULT" and got["via"] == "lane.sock", got
            time.sleep(STOPPED_S)  # the stimulus: main stays stopped; not a synchronisation
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        fault = d.wait_line(r"WARNING robotd: fault \{'cause': 'estop', 'detail': "
                            r"'while main stopped'", DEADLINE_S)
        late = re.search(LATE, fault)
        assert late is not None, fault
        assert STOPPED_S * 0.9 <= float(late.group(1)) < STOPPED_S + 15, fault
        # said before or after the fault's line (whichever of the two tasks runs first)
        wait_until(lambda: any(re.search(STALL, line) for line in d.log), DEADLINE_S,
                   "the main process's stall said")
        (stall,) = [line for line in d.log if re.search(STALL, line)]
        assert float(re.search(STALL, stall).group(1)) >= STOPPED_S * 0.9, stall
        # an e-stop read as it comes says nothing of the kind
        assert c.request("clear_fault")["result"]["state"] == "IDLE"
        c.request("estop", {"reason": "read at once"})
        now = d.wait_line(r"fault \{'cause': 'estop', 'detail': 'read at once'", DEADLINE_S)
        assert "taken by the control lane" not in now, now
    finally:
        c.close()
    d.signal(signal.SIGINT)
    assert d.wait_exit() == 0
    log = d.wait_eof()
    assert sum("the main process was not running" in line for line in log) == 1, log[-20:]
