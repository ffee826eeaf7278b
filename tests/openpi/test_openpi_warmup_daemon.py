"""The daemon's warm-up inference against the real openpi-server from PyPI whose first
inference takes FIRST_DELAY_S (a JIT compile), with acts timing out at 1 s, shorter: a sim
run of config/openpi-droid.toml starts its first episode by itself, once the warm-up is
over (an operator's start meanwhile is refused, saying why); without a warm-up
(warmup_s = 0) it starts at once and the first act times out. A restarted server is warmed
up again, and the acts of the episode running meanwhile wait for it; a warm-up that times
out is a WARNING and acts are served."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from robotd.operator.robotctl import ControlClient
from tests.copy_util import wait_for
from tests.daemon_util import REPO, Daemon

FIRST_DELAY_S = 4.0  # the server's first inference ("compiling"); acts time out at 1 s
ANSWERED = r"openpi warm-up inference answered in \d+\.\d s"


def chunks(client: ControlClient) -> int:
    return client.request("stats")["result"]["chunks"]


def start(tmp_path: Path, server: Any, *sets: str) -> tuple[Daemon, ControlClient]:
    args = ["--set", f'policy.worker="{server.url}"', "--set", "policy.timeout_s=1"]
    for s in sets:
        args += ["--set", s]
    d = Daemon(tmp_path, "--config", str(REPO / "config" / "openpi-droid.toml"), *args)
    return d, ControlClient(d.control_endpoint, timeout_s=15)


@pytest.fixture
def stop() -> Iterator[list[tuple[Daemon, ControlClient]]]:
    """Daemons to stop at the end, each checked to exit 0."""
    started: list[tuple[Daemon, ControlClient]] = []
    yield started
    for d, client in started:
        client.close()
        d.signal()
        assert d.wait_exit() == 0, "".join(d.log[-30:])


def _shapes(described: dict[str, Any]) -> dict[str, Any]:
    """peer_describe's description of a request, without its contents."""
    return {k[1]: (v["type"], v.get("dtype"), v.get("shape")) for k, v in described["items"]}


def test_the_first_act_waits_for_the_warm_up_and_none_times_out(
    openpi_server: Any, tmp_path: Path, stop: list[Any]
) -> None:
    record = tmp_path / "requests.jsonl"
    server = openpi_server(first_delay=FIRST_DELAY_S, record=record)
    d, client = start(tmp_path, server, "policy.openpi.rtc={}")
    stop.append((d, client))
    d.wait_line(r"openpi warm-up inference started")
    status = client.request("status")["result"]
    assert status["link"]["warmup"].startswith("running for "), status  # the server takes 4 s
    assert status["state"] == "IDLE", status  # the sim's first episode waits for it
    refused = client.request("start", {"task": "now"})
    assert refused["ok"] is False and refused["error"]["code"] == "policy_not_ready", refused
    said = refused["error"]["message"]
    assert "warm-up inference" in said and "is running for " in said, said
    d.wait_line(r"operator: start failed: policy_not_ready: start refused: the openpi server")
    d.wait_line(ANSWERED)
    wait_for(lambda: chunks(client) >= 5, "chunks after the warm-up")
    s = client.request("stats")["result"]
    assert s["act_errors"] == 0 and s["episode_resets"] == 0, s
    status = client.request("status")["result"]
    assert status["state"] == "RUNNING" and status["episode"] == 1, status  # not starved
    assert status["link"]["warmup"].startswith("answered in ")
    assert not [line for line in d.log if "ActTimeout" in line or "no reply within" in line]
    shown = subprocess.run(
        [sys.executable, "-m", "robotd.operator.robotctl", "status", "--endpoint",
         d.control_endpoint], capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "warmup answered in " in shown.stdout, shown.stdout
    # What the server received: the warm-up first, shaped as the first act (the episode's
    # first, asked after it: rtc fields included), with neutral contents.
    warm, first, *_ = [json.loads(line) for line in record.read_text().splitlines()]
    assert _shapes(warm) == _shapes(first)
    items = {k[1]: v for k, v in warm["items"]}
    black = hashlib.sha256(np.zeros((224, 224, 3), np.uint8).tobytes()).hexdigest()[:16]
    assert items["observation/exterior_image_1_left"]["sha"] == black
    assert items["prompt"]["value"] == repr("pick up the object")  # the input's default
    assert _shapes(warm)["prefix"] == ("ndarray", "<f4", [0, 8])


def test_without_the_warm_up_the_first_act_times_out(
    openpi_server: Any, tmp_path: Path, stop: list[Any]
) -> None:
    """The same server and timeout, warmup_s = 0: what the warm-up is for."""
    server = openpi_server(first_delay=FIRST_DELAY_S)
    d, client = start(tmp_path, server, "policy.openpi.warmup_s=0")
    stop.append((d, client))
    d.wait_line(r"policy worker gone: ActTimeout", timeout=60)
    assert not [line for line in d.log if "warm-up" in line]


def test_a_restarted_server_is_warmed_up_again(
    openpi_server: Any, tmp_path: Path, stop: list[Any]
) -> None:
    server = openpi_server(first_delay=FIRST_DELAY_S)
    d, client = start(tmp_path, server)
    stop.append((d, client))
    d.wait_line(ANSWERED)
    wait_for(lambda: chunks(client) >= 5, "chunks after the warm-up")
    server.kill()
    d.wait_line(r"policy worker gone")
    server.start()  # a new process: its first inference is slow again
    d.wait_line(r"policy worker back after", timeout=60)
    d.wait_line(ANSWERED, timeout=60)
    n = chunks(client)
    wait_for(lambda: chunks(client) >= n + 5, "chunks from the restarted server")
    assert not [line for line in d.log if "ActTimeout" in line]
    assert client.request("stats")["result"]["act_errors"] == 0


def test_a_warm_up_that_times_out_warns_and_acts_are_served(
    openpi_server: Any, tmp_path: Path, stop: list[Any]
) -> None:
    """The first inference takes longer than warmup_s: a WARNING, acts go (the first is
    answered once the server is done, within its 10 s), the late reply is dropped."""
    server = openpi_server(first_delay=4.0)
    d, client = start(tmp_path, server, "policy.openpi.warmup_s=1", "policy.timeout_s=10")
    stop.append((d, client))
    line = d.wait_line(r"openpi warm-up inference not answered within 1 s")
    assert "WARNING" in line, line
    d.wait_line(r"openpi warm-up inference answered late")
    wait_for(lambda: chunks(client) >= 5, "chunks after the warm-up timed out")
    s = client.request("stats")["result"]
    assert s["act_errors"] == 0 and s["episode_resets"] == 0 and s["unknown_replies"] == 0, s
    assert client.request("status")["result"]["link"]["warmup"].startswith("not answered")
