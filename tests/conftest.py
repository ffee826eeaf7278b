"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon_util import Daemon


@pytest.fixture(autouse=True)
def _no_daemon_left_behind() -> Iterator[None]:
    """A test that fails half-way must not leave its daemon running for the next (daemons
    of wider-scoped fixtures, started before this, are their fixtures' business)."""
    before = len(Daemon.started)
    yield
    Daemon.kill_all(since=before)
