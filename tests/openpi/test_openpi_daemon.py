"""The daemon driven by a real openpi server (openpi-server from PyPI, in the peer venv):
a sim run (config/openpi-droid.toml) acts through it; a policy that raises (text frame,
close 1011), a server killed and started again, and a server that never answers each make
the robot hold, the link reconnect, and the episode go on in a new one — never a hang."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import msgpack
import numpy as np
import pytest
import zmq

from robotd.operator.robotctl import ControlClient
from robotd.trace.codec import frame_bytes
from robotd.trace.reader import read_all
from tests.copy_util import wait_for
from tests.daemon_util import REPO, Daemon

METADATA = {"policy": "droid-test", "action_horizon": 10}


def chunks(client: ControlClient) -> int:
    return client.request("stats")["result"]["chunks"]


@pytest.fixture
def rig(openpi_server: Any, tmp_path: Path) -> Iterator[tuple[Daemon, ControlClient, Any]]:
    server = openpi_server(policy="test", metadata=METADATA)
    d = Daemon(
        tmp_path,
        "--config",
        str(REPO / "config" / "openpi-droid.toml"),
        "--set",
        f'policy.worker="{server.url}"',
        "--set",
        "policy.timeout_s=3",
    )
    d.wait_line(r"episode_start")
    client = ControlClient(d.control_endpoint, timeout_s=15)
    wait_for(lambda: chunks(client) >= 5, "chunks from the openpi server")
    yield d, client, server
    client.close()
    d.signal()
    assert d.wait_exit() == 0, "".join(d.log[-30:])


def start_with(client: ControlClient, task: str) -> None:
    for cmd in ("stop", "reset_done"):
        client.request(cmd)
    reply = client.request("start", {"task": task})
    assert reply["ok"], reply


def test_a_sim_run_acts_through_an_openpi_server(rig: Any) -> None:
    _d, client, _server = rig
    s = client.request("stats")["result"]
    assert s["acts"] >= 5 and s["episode_resets"] == 0
    status = client.request("status")["result"]
    assert status["link"]["state"] == "up" and status["link"]["server"]["connected"]
    # The server's metadata frame, read first and kept, as robotctl shows it.
    assert status["link"]["server"]["metadata"] == METADATA
    shown = subprocess.run(
        [sys.executable, "-m", "robotd.operator.robotctl", "status", "--endpoint",
         _d.control_endpoint], capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "droid-test" in shown.stdout and "action_horizon" in shown.stdout
    # The act round trip and the server's own infer time (openpi's server_timing.infer_ms),
    # in the run's counters and on the telemetry socket.
    assert s["act_rtt_ms"]["p50"] > 0 and s["infer_ms"]["p50"] >= 0
    assert s["infer_ms"]["p50"] < s["act_rtt_ms"]["p50"]
    telemetry = _first_telemetry(_d.dir / "telemetry.sock")
    assert telemetry["act_rtt_ms"]["p50"] > 0 and "p50" in telemetry["infer_ms"]


def _first_telemetry(sock: Path) -> dict[str, Any]:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"status")
    sub.connect(f"ipc://{sock}")
    try:
        assert sub.poll(30_000), "no telemetry within 30 s"
        _topic, body = sub.recv_multipart()
        return msgpack.unpackb(body)
    finally:
        sub.close(linger=0)


def test_the_frames_the_server_read_are_in_the_trace(rig: Any) -> None:
    d, client, _server = rig
    assert client.request("stop")["ok"]
    (run,) = [p for p in d.traces.iterdir() if p.is_dir()]
    path = run / "episode-000001.mcap"

    def closed() -> bool:
        return path.exists() and read_all(path)[1].status.complete

    wait_for(closed, "the episode's trace file closed", every=0.2)
    msgs, _ = read_all(path)
    frames = {cam: [m.record for m in msgs if m.topic == f"/camera/{cam}"]
              for cam in ("exterior", "wrist")}  # fmt: skip
    for cam, got in frames.items():
        assert got, f"no {cam} frames traced for an openpi run"
        img = cv2.imdecode(np.frombuffer(frame_bytes(got[-1]), np.uint8), cv2.IMREAD_COLOR)
        assert got[-1]["format"] == "jpeg" and img.shape == (480, 640, 3)
    indices = [r["frame_index"] for r in frames["exterior"]]
    assert indices == sorted(set(indices))  # each frame once, as captured


def test_a_policy_that_raises_holds_reconnects_and_goes_on_in_a_new_episode(rig: Any) -> None:
    d, client, _server = rig
    start_with(client, "raise")  # the test policy raises on this prompt
    d.wait_line(r"openpi server failed the act")
    d.wait_line(r"test policy failure")  # the server's traceback, logged
    d.wait_line(r"policy worker gone: ServerError")
    d.wait_line(r"policy worker back after")
    d.wait_line(r"episode_reset")
    start_with(client, "pick up the object")
    n = chunks(client)
    wait_for(lambda: chunks(client) >= n + 5, "chunks after the failure")


def test_a_server_killed_and_started_again(rig: Any) -> None:
    d, client, server = rig
    server.kill()
    d.wait_line(r"policy worker gone")
    server.start()
    d.wait_line(r"policy worker back after", timeout=60)
    n = chunks(client)
    wait_for(lambda: chunks(client) >= n + 5, "chunks from the restarted server")
    assert client.request("stats")["result"]["episode_resets"] >= 1


def test_a_server_that_never_answers_is_a_clear_error_and_a_hold(rig: Any) -> None:
    d, client, server = rig
    start_with(client, "hang")  # the test policy blocks: the server answers nothing more
    d.wait_line(r"policy worker gone: ActTimeout", timeout=30)
    status = client.request("status")["result"]  # the daemon answers meanwhile
    assert status["link"]["state"] == "gone"
    server.kill()  # a hung server stays hung: replace it
    server.start()
    d.wait_line(r"policy worker back after", timeout=60)
    start_with(client, "pick up the object")
    n = chunks(client)
    wait_for(lambda: chunks(client) >= n + 5, "chunks from the new server")


def test_realtime_acts_hand_an_openpi_server_the_frozen_prefix_and_delay(
    openpi_server: Any, tmp_path: Path
) -> None:
    """With `[policy.openpi.rtc]`, each realtime act carries `prefix` (the rows the robot
    plays while the server computes, float32, at most `inference_delay` of them) and
    `inference_delay`, as real-time chunking servers read them; the robot then keeps that
    prefix whatever the answer (the contract says rtc)."""
    record = tmp_path / "requests.jsonl"
    server = openpi_server(policy="test", record=record)
    d = Daemon(tmp_path, "--config", str(REPO / "config" / "openpi-droid.toml"),
               "--set", f'policy.worker="{server.url}"', "--set", "policy.openpi.rtc={}",
               "--duration", "4")  # fmt: skip
    assert d.wait_exit() == 0, "".join(d.log[-30:])
    assert any("'rtc': True" in line for line in d.log if "contract" in line), d.log[-30:]
    seen = [dict((k[1], v) for k, v in json.loads(line)["items"])
            for line in record.read_text().splitlines()]  # fmt: skip
    assert len(seen) >= 5
    with_prefix = 0
    for req in seen:
        delay = int(req["inference_delay"]["value"])
        prefix = req["prefix"]
        assert delay >= 1 and prefix["type"] == "ndarray" and prefix["dtype"] == "<f4"
        rows, joints = prefix["shape"]
        assert rows <= delay and joints == 8  # DROID: 7 joints and the gripper
        with_prefix += rows > 0
    assert with_prefix >= len(seen) - 2  # all but the first acts (an empty queue) hand rows
    assert d.result()["act_errors"] == 0
