"""Policies for tests/test_local_hello.py, importable by the local worker's copies (the
daemon runs from the repository root)."""

from __future__ import annotations

import threading
import time
from typing import Any

from robotd.demo import DotFollower


class NeverReady:
    """Never finishes loading: the worker stays up without ever serving (a policy stuck in
    its set-up, a model that takes longer to load than the run may wait)."""

    def __init__(self, **_args: Any) -> None:  # the sim config's demo arguments
        threading.Event().wait()

    def infer(self, inputs: Any, *, episode: Any = None) -> Any:
        raise AssertionError("never loaded")


class SlowToLoad(DotFollower):
    """The demo policy, loading for `load_s` first (a checkpoint read on a slow computer):
    longer than a short --duration, shorter than policy.start_s."""

    def __init__(self, *, load_s: float = 0.0, **args: Any) -> None:
        time.sleep(load_s)  # the load being modelled, not a synchronisation
        super().__init__(**args)
