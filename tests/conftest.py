"""Suite-wide fixtures."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.daemon_util import Daemon

# A suite started in the background of a script (`make test &`) inherits SIGINT ignored, and
# so would every process it starts: `robotctl watch`, which the tests stop with a Ctrl-C
# (SIGINT) as an operator does, would then never stop. With a handler here, the processes
# started from the tests get SIGINT's default back (exec resets handlers, not SIG_IGN).
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _no_daemon_left_behind() -> Iterator[None]:
    """A test that fails half-way must not leave its daemon running for the next (daemons
    of wider-scoped fixtures, started before this, are their fixtures' business)."""
    before = len(Daemon.started)
    yield
    Daemon.kill_all(since=before)
