"""The whole daemon as a user runs it: real processes, shared memory and sockets."""

from __future__ import annotations

import os
import re
import signal

import numpy as np
import pytest

from tests.daemon_util import Daemon, processes_mentioning, shm_of, wait_until

SUMMARY_KEYS = {
    "ticks",
    "hz",
    "lateness_us",
    "missed_ticks",
    "episodes",
    "acts",
    "chunks",
    "holds",
    "stale_chunks",
    "rows_dropped",
    "episode_resets",
    "interventions",
    "clipped",
    "clamped",
    "rejected",
    "tracking_error",
}


def assert_nothing_left(d: Daemon) -> None:
    wait_until(lambda: not processes_mentioning(str(d.dir)), 10, "children to exit")
    wait_until(lambda: not processes_mentioning(f"robotd-{d.proc.pid}-"), 10, "cameras to exit")
    assert shm_of(d.proc.pid) == []
    assert not list(d.dir.glob("*.sock"))


def test_run_for_a_duration_writes_the_summary_and_leaves_nothing(tmp_path):
    d = Daemon(tmp_path, "--duration", "4")
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    s = d.result()
    assert set(s) >= SUMMARY_KEYS
    assert set(s["lateness_us"]) == {"p50", "p99", "p999", "max"}
    assert set(s["tracking_error"]) == {"mean", "p95", "played_mean"}
    # the first chunk's wait holds the arm away from the dot: counted in the mean only
    assert 0 < s["tracking_error"]["played_mean"] < s["tracking_error"]["mean"], s
    assert s["ticks"] > 60 and s["acts"] > 0 and s["chunks"] > 0 and s["episodes"] == 1
    assert 20 < s["hz"] < 40
    assert_nothing_left(d)


def test_sigint_stops_everything_cleanly(tmp_path):
    d = Daemon(tmp_path)
    d.wait_line(r"episode_start")
    d.signal(signal.SIGINT)
    assert d.wait_exit() == 0
    assert d.result()["ticks"] > 0
    assert_nothing_left(d)


def test_ctrl_c_to_the_whole_process_group_still_stops_in_order(tmp_path):
    """A terminal's Ctrl-C reaches every process of the group at once. The local worker
    leaves it to its daemon, which closes its link to the worker before stopping it: no
    lost connection is logged, and no worker exit is taken for a failure."""
    d = Daemon(tmp_path)
    d.wait_line(r"episode_start")
    os.killpg(d.proc.pid, signal.SIGINT)
    assert d.wait_exit() == 0
    log = d.wait_eof()
    noise = [line for line in log if re.search(r"act connection|worker (exited|killed by)", line)]
    assert not noise, "".join(noise)
    assert_nothing_left(d)


def test_sigkill_of_main_the_lane_holds_then_estops_exits_and_leaves_nothing(tmp_path):
    d = Daemon(tmp_path, "--set", "control.orphan_s=1.5")
    d.wait_line(r"episode_start")
    assert len(processes_mentioning(str(d.dir))) >= 2  # control and worker carry the run dir
    d.signal(signal.SIGKILL)
    d.wait_exit()
    # its stderr is ours; the lines' times are when they were written, not when read here
    said, gone = d.wait_line_at(r"control: the main process is gone: holding 1.5 s")
    # stamped as the daemon's own lines are: time and level before the process's name
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR control: ", said), said
    estop = r"control: the e-stop is applied \(torque off\): the control lane exits"
    _, stopped = d.wait_line_at(estop)
    assert stopped - gone >= 1.4  # it held (in FAULT) before the e-stop

    def all_dead() -> bool:
        return not processes_mentioning(str(d.dir)) and not processes_mentioning(
            f"robotd-{d.proc.pid}-"
        )

    wait_until(all_dead, 10, "the lane, the cameras and the worker to exit")
    assert shm_of(d.proc.pid) == []
    assert not list(d.dir.glob("*.sock"))


def test_a_restart_removes_shared_memory_a_dead_daemon_left(tmp_path):
    from robotd.runtime.children import clean_stale_shm
    from robotd.shm import SHM_DIR

    dead = 2**22 + 17  # above pid_max on this machine: no live process has it
    assert not os.path.exists(f"/proc/{dead}")
    left = [SHM_DIR / f"robotd-{dead}-top", SHM_DIR / f"robotd-{dead}-sim-world"]
    for path in left:
        path.write_bytes(b"x")
    clean_stale_shm()
    assert not any(p.exists() for p in left)


def test_bad_config_exits_2_naming_the_key(tmp_path):
    d = Daemon(tmp_path, "--set", "control.hz=-5")
    assert d.wait_exit() == 2
    assert "control.hz: must be > 0, got -5" in "".join(d.log)


@pytest.mark.parametrize("policy", ["no.such.module:Policy"])
def test_a_policy_that_cannot_load_fails_start_up_clearly(tmp_path, policy):
    d = Daemon(tmp_path, "--set", f'policy.serve="{policy}"', "--duration", "20")
    code = d.wait_exit(90)
    assert code != 0
    assert "no.such.module" in "".join(d.log)
    assert_nothing_left(d)


def test_a_second_daemon_on_the_same_run_dir_is_refused_and_the_first_goes_on(tmp_path):
    from robotd.operator.robotctl import ControlClient

    first = Daemon(tmp_path / "a")
    first.wait_line(r"operator socket")
    second = Daemon(tmp_path / "b", "--set", f'runtime.dir="{first.dir}"', "--duration", "3")
    assert second.wait_exit() == 2
    assert f"runtime.dir {first.dir} is in use by robotd pid {first.proc.pid}" in "".join(
        second.log
    )
    client = ControlClient(first.control_endpoint, timeout_s=5)
    try:
        assert client.request("status")["result"]["state"] == "RUNNING"
    finally:
        client.close()
    first.signal()
    assert first.wait_exit() == 0


def test_an_act_cut_short_by_the_daemons_own_stop_is_not_an_act_error(tmp_path):
    """The daemon stops while an act is still computing (a remote worker whose policy takes
    4 s): the act ends unanswered, said so in the log, and is not counted an act error."""
    import subprocess
    import sys

    from tests.daemon_util import REPO

    endpoint = f"ipc://{tmp_path}/w.sock"
    with (tmp_path / "worker.log").open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "robotd", "serve", "robotd.demo:DotFollower", "--bind",
             endpoint, "--arg", "latency_ms=4000", "--copies", "0"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        d = Daemon(tmp_path, "--worker", endpoint)
        d.wait_line(r"episode_start", timeout=60)
        d.signal(signal.SIGINT)  # the first act is still computing
        assert d.wait_exit() == 0, "".join(d.log[-30:])
        assert any("not answered before the daemon stopped" in line for line in d.log), d.log
        s = d.result()
        assert s["act_errors"] == 0 and s["chunks"] == 0
    finally:
        worker.terminate()
        worker.wait(30)


def test_the_first_episode_waits_for_every_cameras_first_frame(caplog):
    """robot.start = "episode": the contract that starts the episode goes down only once
    every camera ring holds a frame (else its first acts would read frames that never
    existed); a camera that never delivers is waited for at most the timeout, then named."""
    import logging
    import os

    import anyio

    from robotd.runtime.daemon import first_frames
    from robotd.shm import FrameRing

    prefix = f"robotd-test-first-{os.getpid()}-"
    rings = {n: FrameRing.create(prefix + n, (4, 4, 3), 4) for n in ("top", "wrist")}
    try:
        rings["top"].write(np.zeros((4, 4, 3), np.uint8), 1)
        with caplog.at_level(logging.WARNING, logger="robotd"):
            anyio.run(first_frames, rings, 0.2)
        assert "cameras ['wrist'] delivered no frame within 0.2 s" in caplog.text
        caplog.clear()
        rings["wrist"].write(np.zeros((4, 4, 3), np.uint8), 2)
        with caplog.at_level(logging.WARNING, logger="robotd"):
            anyio.run(first_frames, rings, 30.0)  # both there: at once, nothing said
        assert caplog.text == ""
    finally:
        for ring in rings.values():
            ring.close()
            ring.unlink()
