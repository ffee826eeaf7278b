"""Faults on the way to the policy, with real processes: a copy of the policy killed, hung or
out of memory, a hostile chunk, the whole worker killed (and restarted after 1 s, after 5 s
that outlast every timeout shortened for it, and, with ROBOTD_SOAK=1, after 60 s at the
defaults) or stopped, the main process stopped while operators e-stop.
The robot holds, the daemon never dies, and the episode goes on in a new one."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from robotd.operator.robotctl import ControlClient
from tests.copy_util import wait_for
from tests.daemon_util import Daemon
from tests.worker_util import Worker

SOAK = os.environ.get("ROBOTD_SOAK") == "1"
LANE = ["--set", 'control.timing="realtime"', "--set", "policy.heartbeat_s=1"]
# A fault that outlasts every timeout, in seconds rather than the defaults' tens: the robot's
# patience 3 s (max_hold_steps 90 at 30 Hz, so the episode ends starved) and the reconnect
# backoff's cap 1 s (reached after 2.4 s of attempts, then tried at the cap).
SHORT_TIMEOUTS = ["--set", "control.max_hold_steps=90", "--set", "policy.reconnect_max_s=1"]
OUTLASTS_S = 5.0


@pytest.fixture
def worker() -> Iterator[Worker]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rbt-f-") as tmp:  # ipc paths must stay short
        w = Worker(Path(tmp))
        yield w
        w.stop()


def running(worker: Worker, tmp: Path, *extra: str) -> Daemon:
    d = Daemon(tmp, "--worker", worker.endpoint, *LANE, *extra)
    d.wait_line(r"episode_start")
    wait_for(lambda: len(worker.acts()) >= 3, "the first acts")
    return d


def new_episode_after(worker: Worker, old: str) -> dict[str, Any]:
    def first() -> dict[str, Any] | None:
        return next((a for a in worker.acts() if a["episode"] not in (old, "None")), None)

    return wait_for(first, "an act of the new worker-side episode")


def assert_fresh_start(act: dict[str, Any]) -> None:
    """The new episode's first act is its step 0, and its window reads that step alone
    (padded before 0 with step 0's values): nothing of the old episode."""
    assert act["step"] == 0
    assert act["steps"] == [-3, 0]
    assert act["pos"][0] == act["pos"][1]


STARVED = re.compile(r"episode_end .*'outcome': 'starved'")


def acts_again(d: Daemon, worker: Worker, seen: int, what: str) -> None:
    """Acts on the worker again (3 past the `seen` before). Away longer than the robot's
    patience (max_hold_steps / hz; on a loaded machine the worker's own restart alone can
    take that long), the watchdog ended the episode starved, the robot holding: then the
    operator starts the next one, as one would."""
    started_again = False

    def acting() -> bool:
        nonlocal started_again
        if len(worker.acts()) >= seen + 3:
            return True
        if not started_again and any(STARVED.search(line) for line in d.log):
            started_again = True
            client = ControlClient(d.control_endpoint, timeout_s=15)
            try:
                assert client.request("reset_done")["ok"]
                assert client.request("start")["ok"]
            finally:
                client.close()
        return False

    wait_for(acting, what)


def finish(d: Daemon) -> dict[str, Any]:
    d.signal()
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    return d.result()


@pytest.mark.parametrize(
    ("fault", "cause"),
    [("kill", "SIGKILL"), ("hang", "hung"), ("oom", "out_of_memory"), ("exit", "crashed")],
)
def test_a_lost_copy_resets_the_episode_and_it_goes_on(
    worker: Worker, tmp_path: Path, fault: str, cause: str
) -> None:
    d = running(worker, tmp_path)
    old = worker.acts()[-1]["episode"]
    if fault == "kill":
        os.kill(worker.copy_holding(old), signal.SIGKILL)
    else:
        worker.flag(fault)
    line = d.wait_line(r"episode_reset", timeout=60)
    assert cause in line and old in line
    assert_fresh_start(new_episode_after(worker, old))
    wait_for(lambda: sum(a["episode"] not in (old, "None") for a in worker.acts()) >= 3, "acts")
    s = finish(d)
    assert s["episode_resets"] == 1 and s["stale_rows_played"] == 0
    assert s["episodes"] == 1  # the operator's episode went on


def test_a_chunk_of_three_million_rows_is_refused_before_the_lane(
    worker: Worker, tmp_path: Path
) -> None:
    # the worker refuses the 72 MB answer before it is sent and the daemon repeats the refusal
    # against its own bound; a long heartbeat all the same, so a loaded machine's slow
    # refusal is never taken for a lost worker
    d = running(worker, tmp_path, "--set", "policy.heartbeat_s=30")
    worker.flag("big")
    d.wait_line(r"chunk refused: 3000000 rows, over policy\.max_chunk_rows = 1024", timeout=60)
    n = len(worker.acts())
    wait_for(lambda: len(worker.acts()) >= n + 3, "the acts after the refusal")
    s = finish(d)
    assert s["bad_messages"] == 0 and s["episode_resets"] == 0
    assert s["act_failures"] >= 1


def test_an_absurd_actions_hz_is_refused_at_the_handshake(tmp_path: Path) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rbt-f-") as tmp:
        w = Worker(Path(tmp), "fault_policies:SlowRate")
        try:
            d = Daemon(tmp_path, "--worker", w.endpoint)
            assert d.wait_exit() == 2
            assert "actions.hz 0.0001 is outside 0.1..10000 Hz" in "".join(d.log)
        finally:
            w.stop()


@pytest.mark.parametrize(
    ("away_s", "patience_s"),
    [(1, 10), (OUTLASTS_S, 3), pytest.param(60, 10, marks=pytest.mark.soak)],
)
def test_the_whole_worker_killed_and_started_again(
    worker: Worker, tmp_path: Path, away_s: float, patience_s: float
) -> None:
    if away_s >= 60 and not SOAK:
        pytest.skip("60 s away: ROBOTD_SOAK=1")
    d = running(worker, tmp_path, *(SHORT_TIMEOUTS if patience_s < 10 else ()))
    worker.kill()
    d.wait_line(r"policy worker gone", timeout=30)
    gone = time.monotonic()
    # The fault's own length, not synchronisation: the worker stays away this long.
    time.sleep(max(0.0, away_s - (time.monotonic() - gone)))
    seen = len(worker.acts())
    worker.start()
    d.wait_line(r"policy worker back after", timeout=60)
    acts_again(d, worker, seen, "acts on the new worker")
    s = finish(d)
    assert s["episode_resets"] >= 1 and s["reconnects"] == 1
    assert s["worker_gone_s"] >= min(away_s, 1) * 0.9


@pytest.mark.parametrize(("stopped_s", "patience_s"), [(OUTLASTS_S, 10), (OUTLASTS_S, 3)])
def test_a_stopped_worker_is_gone_then_back_and_its_late_replies_never_play(
    worker: Worker, tmp_path: Path, stopped_s: float, patience_s: float
) -> None:
    d = running(worker, tmp_path, *(SHORT_TIMEOUTS if patience_s < 10 else ()))
    assert worker.proc is not None
    os.kill(worker.proc.pid, signal.SIGSTOP)
    try:
        d.wait_line(r"policy worker gone", timeout=30)
        time.sleep(stopped_s)  # the fault's own length
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
    d.wait_line(r"policy worker back after", timeout=60)
    seen = len(worker.acts())
    acts_again(d, worker, seen, "acts after SIGCONT")
    s = finish(d)
    assert s["episode_resets"] >= 1 and s["stale_rows_played"] == 0


def test_params_set_by_the_operator_apply_from_the_next_episode_and_task_reaches_it(
    tmp_path: Path,
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rbt-f-") as tmp:
        w = Worker(Path(tmp), "fault_policies:Tunable", scheme="ipc")  # the link over ZeroMQ
        d = Daemon(tmp_path, "--worker", w.endpoint, *LANE)
        client = ControlClient(d.control_endpoint, timeout_s=15)
        try:
            d.wait_line(r"episode_start")
            wait_for(lambda: w.acts(), "the first act")
            first = w.acts()[0]["episode"]
            listed = client.request("params")["result"]["policy"]
            assert [(p["name"], p["value"]) for p in listed] == [("gain", 1.0)]
            assert client.request("params", {"set": {"gain": 2.5}})["ok"]
            bad = client.request("params", {"set": {"gain": "fast"}})
            assert bad["error"]["code"] == "bad_params" and "gain" in bad["error"]["message"]
            n = len(w.acts())
            wait_for(lambda: len(w.acts()) >= n + 3, "more acts of the first episode")
            assert {a["gain"] for a in w.acts() if a["episode"] == first} == {1.0}
            for cmd in ("stop", "reset_done"):
                assert client.request(cmd)["ok"], cmd
            assert client.request("start", {"task": "stack the red blocks"})["ok"]
            wait_for(lambda: any(a["episode"] != first for a in w.acts()), "the next episode")
            later = [a for a in w.acts() if a["episode"] != first]
            assert {a["gain"] for a in later} == {2.5}
            # the operator's task text reaches the policy as its Episode's task
            assert {a["task"] for a in later} == {"stack the red blocks"}
            assert {a["task"] for a in w.acts() if a["episode"] == first} == {""}
        finally:
            client.close()
            finish(d)
            w.stop()


def test_a_malformed_handshake_is_final_not_retried(tmp_path: Path) -> None:
    """A worker that answers hello wrongly will not answer better: the daemon exits 2 with
    the field at fault, without retrying for its whole start-up deadline (30 s)."""
    import tempfile

    from tests.fake_router import FakeRouter

    class BadHello(FakeRouter):
        def reply(self, msg: dict[str, Any]) -> Any:
            return {"id": msg.get("id"), "ok": True, "result": {"protocol": 1, "contract": 7}}

    with tempfile.TemporaryDirectory(prefix="rbt-f-") as tmp:
        fake = BadHello(f"ipc://{tmp}/w.sock")
        fake.start()
        try:
            d = Daemon(tmp_path, "--worker", f"ipc://{tmp}/w.sock")
            assert d.wait_exit(timeout=25) == 2
        finally:
            fake.close()
    assert "reply to hello: field 'contract': not a map (int)" in "".join(d.log)
