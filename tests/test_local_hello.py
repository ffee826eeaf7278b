"""A local worker's start is the daemon's own start-up: it is waited for policy.start_s
whatever --duration says (which counts from its serving), and one that lives but never serves is
given up then, the error saying why and where (the local worker, its policy). A real daemon
with a real local worker whose policy loads slowly, or never finishes loading."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.daemon_util import Daemon, processes_mentioning, wait_until

HELLO_DEADLINE_S = 30.0  # robotd.link.connect: the wait without a --duration
POLICY = "tests.hello_policies:NeverReady"


def test_a_local_worker_that_never_serves_is_given_up_at_its_start_deadline(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    d = Daemon(tmp_path, "--set", f'policy.serve="{POLICY}"', "--set", "policy.start_s=3")
    assert d.wait_exit(timeout=90) == 2
    took = time.monotonic() - started
    log = "".join(d.wait_eof())
    where = re.escape(f"policy worker at stream+ipc://{d.dir}/worker-")
    said = rf"{where}\w+\.sock \(the local worker, {re.escape(POLICY)}\) "
    assert re.search(said + r"did not answer hello within 3 s: \S", log), log[-3000:]
    assert "the local worker is running but not serving yet: its policy is still loading" in log
    # Not the default 30 s (start-up itself may take seconds here).
    assert took < HELLO_DEADLINE_S, f"took {took:.1f} s"
    # the worker and its copy still loading the policy are stopped with the daemon
    wait_until(lambda: not processes_mentioning("hello_policies"), 30, "the worker to exit")


def test_a_local_policy_slower_to_load_than_the_duration_still_runs_it(tmp_path: Path) -> None:
    """--duration 1 with a policy loading for 2.5 s: the run waits for it, then runs its 1 s
    (a short --duration on a slow computer is not a start-up failure)."""
    d = Daemon(
        tmp_path,
        "--set", 'policy.serve="tests.hello_policies:SlowToLoad"',
        "--set", "policy.args.load_s=2.5",
        "--duration", "1",
    )  # fmt: skip
    assert d.wait_exit(timeout=90) == 0, "".join(d.wait_eof())[-3000:]
    assert d.result()["chunks"] > 0, d.result()  # the policy it waited for answered
