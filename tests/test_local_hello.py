"""A local worker that lives but never serves is waited for no longer than --duration, as
a remote one is, and the error says why and where (the local worker, its policy). A real
daemon with a real local worker whose policy never finishes loading."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.daemon_util import Daemon, processes_mentioning, wait_until

HELLO_DEADLINE_S = 30.0  # robotd.link.connect: the wait without a --duration
POLICY = "tests.hello_policies:NeverReady"


def test_a_local_worker_that_never_serves_is_waited_for_no_longer_than_the_duration(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    d = Daemon(tmp_path, "--set", f'policy.serve="{POLICY}"', "--duration", "3")
    assert d.wait_exit(timeout=90) == 2
    took = time.monotonic() - started
    log = "".join(d.wait_eof())
    where = re.escape(f"policy worker at stream+ipc://{d.dir}/worker-")
    said = rf"{where}\w+\.sock \(the local worker, {re.escape(POLICY)}\) "
    assert re.search(said + r"did not answer hello within 3 s: \S", log), log[-3000:]
    assert "the local worker is running but not serving yet: its policy is still loading" in log
    # Not the 30 s a run without --duration waits (start-up itself may take seconds here).
    assert took < HELLO_DEADLINE_S, f"took {took:.1f} s"
    # the worker and its copy still loading the policy are stopped with the daemon
    wait_until(lambda: not processes_mentioning("hello_policies"), 30, "the worker to exit")
