"""The reference worker (robotd.worker.server.serve) in a thread of the test's own
process, for tests that look into the policy or lower the worker's limits."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from robotd.worker.server import serve

START_S = 30.0  # a loaded 2-core machine builds a policy slowly


@dataclass
class Served:
    """A worker serving in a thread: `endpoint` is the act endpoint it bound."""

    thread: threading.Thread
    stop_event: threading.Event
    endpoint: str

    def stop(self, timeout: float = 30.0) -> None:
        """Stop it and wait for its thread; AssertionError if the thread stays."""
        self.stop_event.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker's thread did not end"


def start_serving(policy: str, endpoint: str, **kwargs: Any) -> Served:
    """`serve(policy, endpoint, **kwargs)` in a thread, returned once it listens."""
    bound: list[str] = []
    ready, stop = threading.Event(), threading.Event()

    def on_ready(endpoint_bound: str) -> None:
        bound.append(endpoint_bound)
        ready.set()

    thread = threading.Thread(
        target=serve,
        args=(policy, endpoint),
        kwargs={**kwargs, "ready": on_ready, "stop": stop},
        daemon=True,
    )
    thread.start()
    if not ready.wait(START_S):
        stop.set()
        raise AssertionError(f"the worker serving {policy} on {endpoint} did not start")
    return Served(thread, stop, bound[0])


@contextlib.contextmanager
def serving(policy: str, endpoint: str, **kwargs: Any) -> Iterator[str]:
    """start_serving as a context: yields the endpoint bound, stops the worker after."""
    served = start_serving(policy, endpoint, **kwargs)
    try:
        yield served.endpoint
    finally:
        served.stop()
