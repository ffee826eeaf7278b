"""OpenpiLink against the real openpi-server from PyPI (in the peer venv), serving the test
policy of openpi_peer_server.py: end to end, a failing policy, a killed and restarted
server, a server that never answers, the API key, wss://."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import trustme
from peer_venv import REPO

from robotd.config import load_config
from robotd.link.openpi.client import OpenpiLink
from robotd.link.openpi.errors import ActTimeout, ConnectionLost, ServerError
from robotd.link.openpi.options import OpenpiOptions
from robotd.link.openpi.request import build_request, parse_reply

FAST = OpenpiOptions(backoff_initial_s=0.05, backoff_max_s=0.5, connect_timeout_s=5)
SOAK = os.environ.get("ROBOTD_SOAK") == "1"


def _items(echo: dict[str, Any]) -> dict[str, Any]:
    return {k[1]: v for k, v in echo["items"]}


def _prompt(reply: dict[str, Any]) -> str:
    """The prompt the policy saw (peer_describe gives a str's repr)."""
    return _items(reply["echo"])["prompt"]["value"]


def run(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args)


def test_end_to_end_droid(openpi_server: Any) -> None:
    """A DROID request built from the example config reaches the policy as openpi's own
    client would send it; the answer maps onto the robot's joints, timing included."""
    server = openpi_server(metadata={"policy": "test", "action_horizon": 10})
    cfg = load_config(REPO / "config" / "openpi-droid.toml")
    opts = cfg.policy.openpi.model_copy(update={"backoff_initial_s": 0.05})
    rng = np.random.default_rng(0)
    obs = {c: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for c in cfg.cameras}
    obs["joints.pos"] = np.linspace(-1, 1, 8)
    window = {"observations": [obs], "steps": [0]}

    async def main() -> None:
        link = OpenpiLink(server.url, opts)
        metadata = await link.connect(deadline_s=30)
        assert metadata == {"policy": "test", "action_horizon": 10}
        assert link.state.connected and link.state.metadata == metadata
        request = build_request(opts, window, "pick up the cup")
        request["want_actions"] = np.arange(80, dtype=np.float32).reshape(10, 8)
        reply = await link.act(request, timeout_s=10)
        seen = _items(reply["echo"])
        img = seen["observation/exterior_image_1_left"]
        assert (img["dtype"], img["shape"]) == ("|u1", [224, 224, 3])
        assert seen["observation/joint_position"]["shape"] == [7]
        assert seen["observation/gripper_position"]["dtype"] == "<f4"
        assert _prompt(reply) == repr("pick up the cup")
        answer = parse_reply(opts.actions, reply, len(cfg.joints.names))
        assert np.array_equal(answer.rows, request["want_actions"])
        assert answer.infer_ms is not None and answer.infer_ms >= 0
        assert link.state.acts == 1
        await link.close()
        await link.close()  # idempotent
        with pytest.raises(ConnectionLost, match="closed"):
            await link.act({"prompt": "x"}, timeout_s=1)

    run(main)


def test_policy_error_then_reconnect(openpi_server: Any) -> None:
    """A raising policy: openpi sends the traceback as text and closes 1011 → ServerError
    with the text; the link is down until connect(), which works, and so does the next act."""
    server = openpi_server()

    async def main() -> None:
        link = OpenpiLink(server.url, FAST)
        await link.connect(deadline_s=30)
        with pytest.raises(ServerError) as err:
            await link.act({"prompt": "raise"}, timeout_s=10)
        assert "RuntimeError: test policy failure" in err.value.text
        assert "Traceback" in err.value.text
        assert "test policy failure" in str(err.value)
        state = link.state
        assert not state.connected and state.reconnecting_since is not None
        assert "test policy failure" in state.last_error
        with pytest.raises(ConnectionLost, match="not connected"):
            await link.act({"prompt": "x"}, timeout_s=5)
        await link.connect(deadline_s=30)
        reply = await link.act({"prompt": "ok", "want_actions": np.ones((2, 3))}, timeout_s=10)
        assert np.array_equal(reply["actions"], np.ones((2, 3)))
        assert link.state.connects == 2 and link.state.reconnecting_since is None
        await link.close()

    run(main)


def test_server_killed_mid_act_and_restarted(openpi_server: Any) -> None:
    server = openpi_server()

    async def main() -> None:
        link = OpenpiLink(server.url, FAST)
        await link.connect(deadline_s=30)
        async with anyio.create_task_group() as tg:

            async def slow_act() -> None:
                with pytest.raises(ConnectionLost, match="closed during an act"):
                    await link.act({"prompt": "sleep:30"}, timeout_s=60)

            tg.start_soon(slow_act)
            await anyio.wait_all_tasks_blocked()  # the act is sent and waits for its reply
            await anyio.to_thread.run_sync(server.kill)
        assert not link.state.connected
        await anyio.to_thread.run_sync(server.start)
        await link.connect(deadline_s=30)
        reply = await link.act({"prompt": "back"}, timeout_s=10)
        assert _prompt(reply) == repr("back")
        await link.close()

    run(main)


@pytest.mark.soak
def test_server_back_after_an_outage(openpi_server: Any) -> None:
    """Killed while idle, back after OUTAGE s (60 with ROBOTD_SOAK=1): the link backs off
    (capped), polls /healthz, reconnects soon after the server is back."""
    outage = 60.0 if SOAK else 2.0
    server = openpi_server()
    opts = OpenpiOptions(backoff_initial_s=0.05, backoff_max_s=2.0, connect_timeout_s=5)

    async def main() -> None:
        link = OpenpiLink(server.url, opts)
        await link.connect(deadline_s=30)
        server.kill()
        with pytest.raises(ConnectionLost):
            await link.act({"prompt": "x"}, timeout_s=5)
        back_at: list[float] = []

        async def restart() -> None:
            await anyio.sleep(outage)
            await anyio.to_thread.run_sync(server.start)
            back_at.append(time.monotonic())

        async with anyio.create_task_group() as tg:
            tg.start_soon(restart)
            t0 = time.monotonic()
            await link.connect(deadline_s=outage + 60)
            tg.cancel_scope.cancel()
        assert back_at, "connected before the server was back"
        assert time.monotonic() - t0 >= outage
        # the server was ready at back_at; the capped backoff reconnects within its cap
        assert time.monotonic() - back_at[0] < opts.backoff_max_s + opts.connect_timeout_s
        assert "refused" in link.state.last_error  # what the outage looked like, kept
        reply = await link.act({"prompt": "again"}, timeout_s=10)
        assert _prompt(reply) == repr("again")
        await link.close()

    run(main)


def test_hung_policy_times_out_and_late_reply_is_never_read(openpi_server: Any) -> None:
    server = openpi_server()

    async def main() -> None:
        link = OpenpiLink(server.url, FAST)
        await link.connect(deadline_s=30)
        t0 = time.monotonic()
        with pytest.raises(ActTimeout, match=r"no reply within 0\.5 s"):
            await link.act({"prompt": "sleep:1.5", "want_actions": np.zeros((1, 1))}, 0.5)
        assert time.monotonic() - t0 < 5
        assert not link.state.connected
        await link.connect(deadline_s=30)  # the server is free again after its sleep
        reply = await link.act({"prompt": "new", "want_actions": np.full((1, 1), 7.0)}, 10)
        assert reply["actions"][0, 0] == 7.0  # this request's answer, not the late one
        await link.close()

    run(main)


def test_server_that_never_answers(openpi_server: Any) -> None:
    """openpi's server blocked in its policy answers nothing, not even /healthz: the act
    times out, connect gives up at its deadline with the reason; nothing hangs."""
    server = openpi_server()

    async def main() -> None:
        link = OpenpiLink(server.url, OpenpiOptions(connect_timeout_s=1, backoff_max_s=0.5))
        await link.connect(deadline_s=30)
        with pytest.raises(ActTimeout):
            await link.act({"prompt": "hang"}, timeout_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(ConnectionLost, match=r"no connection within 2 s"):
            await link.connect(deadline_s=2)
        assert time.monotonic() - t0 < 2 + 1 + 3  # deadline, one attempt's timeout, slack
        assert "timed out" in link.state.last_error or "timeout" in link.state.last_error
        await link.close()

    run(main)


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A TCP port that accepts and never says a word (a hung process behind the port)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    for s in [*held, sock]:
        s.close()


@pytest.mark.parametrize("healthz", ["/healthz", ""])
def test_silent_port_never_hangs_connect(silent_listener: int, healthz: str) -> None:
    opts = OpenpiOptions(connect_timeout_s=0.5, backoff_max_s=0.25, healthz=healthz)

    async def main() -> None:
        link = OpenpiLink(f"ws://127.0.0.1:{silent_listener}", opts)
        t0 = time.monotonic()
        with pytest.raises(ConnectionLost, match=r"no connection within 1\.5 s"):
            await link.connect(deadline_s=1.5)
        assert time.monotonic() - t0 < 1.5 + 0.5 + 3
        await link.close()

    run(main)


def test_api_key_from_environment(openpi_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server = openpi_server(api_key="s3cret-key")
    monkeypatch.setenv("TEST_OPENPI_KEY", "s3cret-key")

    async def main() -> None:
        good = FAST.model_copy(update={"api_key_env": "TEST_OPENPI_KEY"})
        link = OpenpiLink(server.url, good)
        await link.connect(deadline_s=30)
        assert (await link.act({"prompt": "k"}, 10))["actions"].shape == (10, 8)
        await link.close()
        bad = OpenpiOptions.model_validate(
            {"api_key": "wrong-key", "backoff_initial_s": 0.1, "backoff_max_s": 0.2}
        )
        link = OpenpiLink(server.url, bad)
        with pytest.raises(ConnectionLost, match="refused the API key") as err:
            await link.connect(deadline_s=1)
        assert "wrong-key" not in str(err.value) and "wrong-key" not in repr(bad)
        await link.close()

    run(main)
    monkeypatch.delenv("TEST_OPENPI_KEY")
    with pytest.raises(ValueError, match="TEST_OPENPI_KEY"):
        OpenpiLink(server.url, OpenpiOptions(api_key_env="TEST_OPENPI_KEY"))


def test_wss(openpi_server: Any, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, pem = tmp_path / "ca.pem", tmp_path / "server.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
    server = openpi_server(tls=(pem, pem), ca=ca_file)
    assert server.url.startswith("wss://")

    async def main() -> None:
        link = OpenpiLink(server.url, FAST.model_copy(update={"ca_file": str(ca_file)}))
        await link.connect(deadline_s=30)
        reply = await link.act({"prompt": "tls", "want_actions": np.eye(3)}, 10)
        assert np.array_equal(reply["actions"], np.eye(3))
        await link.close()
        untrusted = OpenpiLink(server.url, FAST)  # the system's CAs do not know this one
        with pytest.raises(ConnectionLost, match=r"within 1 s"):
            await untrusted.connect(deadline_s=1)
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.state.last_error
        await untrusted.close()

    run(main)


def test_cancelled_act_drops_the_connection(openpi_server: Any) -> None:
    server = openpi_server()

    async def main() -> None:
        link = OpenpiLink(server.url, FAST)
        await link.connect(deadline_s=30)
        with anyio.move_on_after(0.3):
            await link.act({"prompt": "sleep:1"}, timeout_s=30)
        assert not link.state.connected  # its reply must never answer a later request
        await link.connect(deadline_s=30)
        reply = await link.act({"prompt": "fresh"}, timeout_s=10)
        assert _prompt(reply) == repr("fresh")
        await link.close()

    run(main)
