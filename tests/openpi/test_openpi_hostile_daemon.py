"""The daemon (a real sim run of config/openpi-droid.toml) driven by a hostile server
(hostile_server.py) through one run's phases: garbage replies, a connection closed while
the robot is idle, a server that accepts and never answers, a server gone and back. In
each the loop keeps ticking and the robot holds (no chunk is played), the link says why,
the log stays short, and after the server is back the episode goes on in a new
worker-side episode. The outages last OUTAGE_S, 60 s with ROBOTD_SOAK=1 (the link's
timeouts and backoff are configured short, so the short run sees every path)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile_server import Hostile, Peer, wait_until

from robotd.link.openpi import codec
from robotd.operator.robotctl import ControlClient
from tests.daemon_util import REPO, Daemon

SOAK = os.environ.get("ROBOTD_SOAK") == "1"
OUTAGE_S = 60.0 if SOAK else 3.0
DEADLINE_S = 60.0
GOOD = codec.packb({"actions": np.zeros((10, 8), np.float32)})
LIAR = {b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [1 << 29, 8]}
GARBAGE = [
    b"\xc1",
    codec.packb({"actions": np.full((10, 8), np.nan, np.float32)}),
    codec.packb({"actions": LIAR}),  # claims 16 GiB, holds nothing
    codec.packb({"actions": np.zeros((10, 3), np.float32)}),
]


class Mode:
    """What the server does with the next request: "good", "garbage", "hang" or "twice"
    (its good answer sent twice, the second answering nothing; then "good")."""

    kind = "good"


def script(mode: type[Mode]) -> Any:
    async def serve(peer: Peer) -> None:
        peer.send(codec.packb({"policy": "hostile"}))
        n = 0
        while await peer.request() is not None:
            if mode.kind == "hang":
                peer.answer_pings = False
                return await peer.hang()
            n += 1
            peer.send(GARBAGE[n % len(GARBAGE)] if mode.kind == "garbage" else GOOD)
            if mode.kind == "twice":  # once: the server behaves after it
                mode.kind = "good"
                peer.send(GOOD)

    return serve


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Daemon, ControlClient, Hostile]]:
    Mode.kind = "good"
    with Hostile(script(Mode)) as server:
        d = Daemon(tmp_path, "--config", str(REPO / "config" / "openpi-droid.toml"),
                   "--set", f'policy.worker="{server.url}"', "--set", "policy.timeout_s=1",
                   "--set", "policy.reconnect_max_s=0.5",
                   "--set", "policy.openpi.connect_timeout_s=1",
                   "--set", "policy.openpi.backoff_initial_s=0.05",
                   "--set", "policy.openpi.backoff_max_s=0.5",
                   "--set", "policy.openpi.keepalive_s=1")  # fmt: skip
        client = ControlClient(d.control_endpoint, timeout_s=15)
        try:
            d.wait_line(r"episode_start", timeout=DEADLINE_S)
            yield d, client, server
        finally:
            client.close()
            d.signal()
            assert d.wait_exit() == 0, "".join(d.log[-30:])


def stats(client: ControlClient) -> dict[str, Any]:
    return client.request("stats")["result"]


def link(client: ControlClient) -> dict[str, Any]:
    return client.request("status")["result"]["link"]


def grows(client: ControlClient, key: str, by: int, what: str) -> None:
    start = stats(client)[key]
    wait_until(lambda: stats(client)[key] >= start + by, what, timeout=DEADLINE_S)


def held(client: ControlClient, phase: Any, what: str) -> None:
    """While `phase()` runs, no chunk arrives and the loop ticks and holds."""
    before = stats(client)
    phase()
    after = stats(client)
    assert after["chunks"] == before["chunks"], f"{what}: chunks arrived"
    assert after["ticks"] > before["ticks"] and after["holds"] > before["holds"], what


def restart(client: ControlClient, task: str = "go on") -> None:
    for cmd in ("stop", "reset_done"):
        client.request(cmd)
    assert client.request("start", {"task": task})["ok"]


@pytest.mark.soak
@pytest.mark.timeout(360 if SOAK else 120)  # two outages of OUTAGE_S, and the rest
def test_a_hostile_server_through_one_run(rig: Any) -> None:
    d, client, server = rig
    grows(client, "chunks", 3, "chunks from the server while it behaves")

    # Garbage replies: each act refused naming its field, the connection kept.
    Mode.kind = "garbage"
    grows(client, "act_errors", 1, "the first garbage reply refused")
    lines = len(d.log)
    held(client, lambda: grows(client, "act_errors", 4, "garbage refused"), "garbage")
    refused = "\n".join(d.log[lines:])
    assert "holds NaN" in refused or "not a valid msgpack" in refused or "needs" in refused
    assert link(client)["state"] == "up"
    assert len(d.log) - lines < 40, d.log[lines:]  # a line an act, the lane's retry paced

    # The robot idle, the server closes the connection: the link says so, and comes back.
    Mode.kind = "good"
    client.request("stop")
    server.call(lambda: [p.close(1001, "restarting") for p in server.peers])
    d.wait_line(r"policy worker gone: openpi connection lost .*closed while idle", DEADLINE_S)
    d.wait_line(r"policy worker back after", DEADLINE_S)
    restart(client)
    grows(client, "chunks", 3, "chunks after the idle reconnect")

    # Accepts and never answers (not the act, not a ping, not the next handshake).
    resets = stats(client)["episode_resets"]
    server.mute = True
    Mode.kind = "hang"
    d.wait_line(r"policy worker gone: ActTimeout: .*no reply within 1 s", DEADLINE_S)
    lines = len(d.log)
    held(client, lambda: _outlast(client), "a server that never answers")
    assert "no reply within 1 s" in link(client)["reason"]
    assert len(d.log) - lines < 20, d.log[lines:]  # a long outage is a few lines
    assert server.open < 8  # every muted attempt given up, not piled up

    # Gone (refused), then back after OUTAGE_S: reconnected, a new worker-side episode.
    server.stop()
    lines = len(d.log)
    held(client, lambda: _outlast(client), "a server gone")
    assert len(d.log) - lines < 20, d.log[lines:]
    server.mute = False
    Mode.kind = "good"
    server.start()
    d.wait_line(r"policy worker back after", DEADLINE_S)
    grows(client, "chunks", 3, "chunks from the server back")
    assert stats(client)["episode_resets"] > resets
    assert link(client)["state"] == "up"


def test_frames_that_answer_nothing_are_counted_in_stats_and_status(rig: Any) -> None:
    """Repro: the openpi link dropped the connection over a frame no request asked for
    (right), but counted it nowhere: stats said unknown_replies 0, as robotd's own worker
    link counts them."""
    d, client, _server = rig
    grows(client, "chunks", 1, "chunks from the server while it behaves")
    assert stats(client)["unknown_replies"] == 0
    Mode.kind = "twice"
    d.wait_line(r"policy worker gone: ConnectionLost: .*no request asked for", DEADLINE_S)
    d.wait_line(r"policy worker back after", DEADLINE_S)
    counted = stats(client)["unknown_replies"]
    assert counted == 1, stats(client)
    assert link(client)["server"]["unknown_replies"] == 1, link(client)
    grows(client, "chunks", 1, "chunks after the reconnect")
    assert stats(client)["unknown_replies"] == counted  # a reconnect keeps the count


def _outlast(client: ControlClient) -> None:
    """OUTAGE_S more of the link gone, on the daemon's own clock (the outage is the time
    itself: there is nothing else to wait on)."""
    start = link(client)["for_s"]

    def still_gone() -> bool:
        now = link(client)
        assert now["state"] == "gone", now
        return now["for_s"] >= start + OUTAGE_S

    wait_until(still_gone, f"the link gone {OUTAGE_S} s more", timeout=OUTAGE_S + DEADLINE_S)
