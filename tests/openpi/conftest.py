"""Fixtures for the openpi link tests: the peer venv (real openpi packages from PyPI) and
openpi-server processes serving the test policy (openpi_peer_server.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from peer_server import PeerServer
from peer_venv import PeerUnavailable, peer_python


@pytest.fixture(scope="session")
def peer() -> Path:
    """The peer venv's python (built on first use); skipped only if pip cannot install."""
    try:
        return peer_python()
    except PeerUnavailable as exc:
        pytest.skip(f"the openpi packages from PyPI cannot be installed here: {exc}")


@pytest.fixture
def openpi_server(peer: Path, tmp_path: Path) -> Iterator[Any]:
    """Factory: openpi_server(policy=..., metadata=..., tls=(cert, key), ca=..., api_key=...)
    starts a server and waits for it; every one started is killed at the end."""
    started: list[PeerServer] = []

    def start(**opts: Any) -> PeerServer:
        server = PeerServer(peer, tmp_path, **opts)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        with contextlib.suppress(Exception):
            server.kill()
