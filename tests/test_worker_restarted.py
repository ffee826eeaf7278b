"""A worker restarted faster than the heartbeat notices (its connection back within
policy.heartbeat_s) is still a new worker: its first ping says another process answers, so
the daemon says hello again, checks the new contract, and the running episode goes on in a
new worker-side episode; a contract it cannot use is refused, the robot holding. Real
`robotd serve` processes, killed with SIGKILL and started again at the same endpoint, over
the byte stream and over ZeroMQ."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from robotd.operator.client import ControlClient
from tests.copy_util import wait_for
from tests.daemon_util import Daemon
from tests.worker_util import Worker

# A heartbeat far longer than the test: only the new process's word can tell it restarted.
LONG_HEARTBEAT = ["--set", 'control.timing="realtime"', "--set", "policy.heartbeat_s=60"]


@pytest.fixture(params=["stream+ipc", "ipc"])
def worker(request: pytest.FixtureRequest) -> Iterator[Worker]:
    with tempfile.TemporaryDirectory(prefix="rbt-r-") as tmp:  # ipc paths must stay short
        w = Worker(Path(tmp), scheme=request.param)
        yield w
        w.stop()


def _restart(worker: Worker, policy: str) -> None:
    """Kill the worker and start `policy` where it was (returns once it serves)."""
    worker.kill()
    worker.log.close()
    worker.policy = policy
    worker.start()


def test_a_worker_restarted_within_the_heartbeat_is_said_hello_to_again(
    worker: Worker, tmp_path: Path
) -> None:
    d = Daemon(tmp_path, "--worker", worker.endpoint, *LONG_HEARTBEAT)
    d.wait_line(r"episode_start")
    first = wait_for(lambda: worker.acts()[-1:], "the first acts")[0]
    _restart(worker, "fault_policies:Recorder")
    gone = d.wait_line(r"policy worker gone: the worker restarted", 60)
    assert "another process answers" in gone, gone
    back = d.wait_line(r"policy worker back after", 60)
    assert back.rstrip().endswith("goes on in a new worker-side episode"), back
    # The new process serves a new worker-side episode (never again the one it never began).
    wait_for(
        lambda: [a for a in worker.acts() if a["pid"] != first["pid"]
                 and a["episode"] != first["episode"]],
        "acts of a new worker-side episode on the new worker",
    )
    d.signal()
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    s = d.result()
    assert s["reconnects"] == 1 and s["episode_resets"] >= 1, s


def test_a_restarted_worker_whose_contract_cannot_be_used_is_refused(
    worker: Worker, tmp_path: Path
) -> None:
    d = Daemon(tmp_path, "--worker", worker.endpoint, *LONG_HEARTBEAT)
    d.wait_line(r"episode_start")
    wait_for(lambda: worker.acts(), "the first acts")
    _restart(worker, "fault_policies:SlowRate")  # actions.hz 0.0001: refused at hello
    d.wait_line(r"policy worker gone: the worker restarted", 60)
    refused = d.wait_line(r"policy worker answers, but its contract cannot be used", 60)
    assert "actions.hz 0.0001 is outside 0.1..10000 Hz" in refused, refused
    # and status says so: the worker is not away, what it serves is refused
    c = ControlClient(d.control_endpoint, timeout_s=15)
    try:
        link = c.request("status")["result"]["link"]
    finally:
        c.close()
    assert link["state"] == "gone" and "actions.hz 0.0001" in link["not_back"], link
    # The daemon goes on (holding), and takes the worker back once it serves a usable one.
    _restart(worker, "fault_policies:Recorder")
    d.wait_line(r"policy worker back after", 60)
    d.signal()
    assert d.wait_exit() == 0, "".join(d.log[-30:])
