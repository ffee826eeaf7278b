"""An operator episode's step count is its own, not its last worker-side episode's: after
a worker-side reset within it (the local worker killed mid-episode), `episode_end` says
the steps the episode made (as many as the trace's ticks of it) and status's `step` only
grows. The real daemon on the sim, its local worker killed and restarted."""

from __future__ import annotations

import ast
import os
import re
import signal
import time
from pathlib import Path

from robotd.operator.client import ControlClient
from robotd.trace.reader import read_all
from tests.daemon_util import Daemon, processes_mentioning
from tests.trace_util import only_run

DEADLINE_S = 60.0  # generous: a loaded 2-core machine (the worker restarts its copies)


def _worker_pid(d: Daemon) -> int:
    (pid,) = [p for p in processes_mentioning(f"--bind stream+ipc://{d.dir}/worker-")
              if b" serve " in Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")]
    return pid


def test_episode_end_and_status_count_the_operator_episodes_steps(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "--set", "control.max_hold_steps=3000")  # no starving meanwhile
    d.wait_line(r"episode_start", DEADLINE_S)
    c = ControlClient(d.control_endpoint, timeout_s=15)
    seen: list[tuple[str, int]] = []  # (wep, step) of each status while it runs

    def status() -> dict:
        st = c.request("status")["result"]
        if st.get("state") == "RUNNING":
            seen.append((st["wep"], st["step"]))
        return st

    def until(ok, what: str) -> dict:
        deadline = time.monotonic() + DEADLINE_S
        while not ok(st := status()):
            assert time.monotonic() < deadline, f"never {what}: {st}"
            time.sleep(0.05)
        return st

    try:
        old = until(lambda st: st.get("state") == "RUNNING" and st["step"] >= 40, "40 steps")
        os.kill(_worker_pid(d), signal.SIGKILL)
        d.wait_line(r"episode_reset .*local worker killed by SIGKILL", DEADLINE_S)
        until(lambda st: st["wep"] != old["wep"], "the new worker-side episode")
        new = until(lambda st: st["wep"] != old["wep"] and st["step"] >= old["step"] + 60,
                    "60 more steps")
        assert c.request("stop")["ok"]
    finally:
        c.close()
    end = d.wait_line(r"INFO robotd: episode_end ", DEADLINE_S)
    d.signal(signal.SIGINT)
    assert d.wait_exit() == 0
    detail = ast.literal_eval(re.search(r"episode_end (\{.*\})", end).group(1))
    assert detail["episode"] == 1 and detail["outcome"] == "stopped", end
    steps = [s for _, s in seen]
    assert steps == sorted(steps), seen  # never back to 0 at the reset
    assert new["step"] > old["step"] and {w for w, _ in seen} >= {old["wep"], new["wep"]}
    (path,) = sorted(only_run(d.traces).glob("episode-*.mcap"))
    msgs, reader = read_all(path)
    assert reader.status.complete, reader.status.message
    ticks = [m.record for m in msgs if m.topic == "/robot/tick"]
    assert {t["wep"] for t in ticks} == {old["wep"], new["wep"]}
    assert detail["steps"] == len(ticks), (end, len(ticks))  # every step of the episode
    last = [t for t in ticks if t["wep"] == new["wep"]]
    assert detail["wep_steps"] == len(last), (end, len(last))  # its last worker-side one's
    assert detail["steps"] > detail["wep_steps"]
