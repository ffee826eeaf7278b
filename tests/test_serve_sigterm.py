"""A worker stops on SIGTERM however many arrive at once. PR_SET_PDEATHSIG sends a local
worker one when its daemon dies, and the daemon's process group may send more: a handler
that set the stop event itself deadlocked when a second signal landed while the first
was inside Event.set (the event's lock held by the same thread), and the worker outlived
its daemon. A real `robotd serve`, real signals."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from tests.copy_util import Worker

DEADLINE_S = 60.0  # a loaded 2-core machine; a deadlocked worker never exits at all


def test_a_burst_of_sigterms_stops_the_worker() -> None:
    for _ in range(3):  # the old handler deadlocked in most of these rounds
        worker = Worker("robotd.demo:DotFollower", "--copies", "1")
        try:
            worker.wait_ready(1)
            worker.client.close()
            for _ in range(3000):  # as fast as this process can send them
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.proc.pid, signal.SIGTERM)
            try:
                code = worker.proc.wait(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                raise AssertionError("the worker did not stop: " + worker.text()[-2000:]) from None
            assert code in (0, -signal.SIGTERM), (code, worker.text()[-2000:])
        finally:
            worker.discard()
