"""Policies for tests/test_local_hello.py, importable by the local worker's copies (the
daemon runs from the repository root)."""

from __future__ import annotations

import threading
from typing import Any


class NeverReady:
    """Never finishes loading: the worker stays up without ever serving (a policy stuck in
    its set-up, a model that takes longer to load than the run may wait)."""

    def __init__(self, **_args: Any) -> None:  # the sim config's demo arguments
        threading.Event().wait()

    def infer(self, inputs: Any, *, episode: Any = None) -> Any:
        raise AssertionError("never loaded")
