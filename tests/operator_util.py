"""A daemon started latched (category 0 e-stops: torque off at once) for a module's
operator tests, and a client of its control socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from robotd.operator.robotctl import ControlClient
from tests.daemon_util import Daemon


def latched(tmp: Path) -> Daemon:
    d = Daemon(tmp, "--set", 'robot.start="latched"', "--set", "safety.estop_category=0")
    d.wait_line(r"operator socket")
    return d


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = latched(tmp_path_factory.mktemp("op"))
    yield d
    d.signal()
    assert d.wait_exit() == 0


@pytest.fixture
def client(daemon: Daemon) -> Iterator[ControlClient]:
    c = ControlClient(daemon.control_endpoint, timeout_s=15)  # generous: CI machines are loaded
    yield c
    c.close()
