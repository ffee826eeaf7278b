"""What a worker's replies may be, held by the daemon's act client on real ZeroMQ sockets
against hand-played workers: a hello whose contract's integers are out of bounds is refused
naming the field and the bound; a second reply to a request already answered is counted
as a duplicate (not as one naming no request), an undecodable one is counted too, each
logged at most once a while per kind."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from robotd import framed, wire
from robotd.contract import MAX_ANSWER_ROWS, Actions, ContractError
from robotd.link.client import PolicyClient, PolicyError
from tests.client_util import dropped_after
from tests.daemon_util import Daemon
from tests.fake_router import FakeRouter
from tests.test_uplink import sockdir

__all__ = ["sockdir"]  # the fixture used here

WELL = {"protocol": 1, "contract": {}, "endpoints": {}, "policy": "p:W"}


def _run(fn: Any) -> Any:
    return anyio.run(fn, backend_options={"use_uvloop": True})


# ---- hello: the contract's integers are bounded -------------------------------------------


def test_open_loop_horizon_is_bounded_by_the_most_rows_a_chunk_may_have() -> None:
    assert Actions(open_loop_horizon=MAX_ANSWER_ROWS).open_loop_horizon == MAX_ANSWER_ROWS
    for n in (MAX_ANSWER_ROWS + 1, 9 * 10**18, 10**30):
        with pytest.raises(ContractError) as refused:
            Actions.from_wire({"open_loop_horizon": n})
        assert str(refused.value) == (
            f"actions.open_loop_horizon: open_loop_horizon {n} is over 4096, the most rows a "
            "chunk may have"
        )


class _Hello(FakeRouter):
    """Answers hello with `contract`, anything else with an empty result."""

    def __init__(self, endpoint: str, contract: dict[str, Any]) -> None:
        super().__init__(endpoint)
        self.contract = contract

    def reply(self, msg: dict[str, Any]) -> Any:
        result = {**WELL, "contract": self.contract} if msg["cmd"] == "hello" else {}
        return {"id": msg["id"], "ok": True, "result": result}


def test_a_hello_with_an_unbounded_open_loop_horizon_is_refused(sockdir: Path) -> None:
    endpoint = f"ipc://{sockdir}/h.sock"
    fake = _Hello(endpoint, {"actions": {"open_loop_horizon": 9 * 10**18}})
    fake.start()

    async def main() -> PolicyError:
        client = PolicyClient(endpoint, timeout_s=10)
        try:
            with pytest.raises(PolicyError) as refused:
                await client.connect()
            return refused.value
        finally:
            await client.close()

    try:
        error = _run(main)
    finally:
        fake.close()
    assert error.code == "bad_reply", error
    assert error.message == (
        "reply to hello: contract.actions.open_loop_horizon: open_loop_horizon "
        "9000000000000000000 is over 4096, the most rows a chunk may have"
    )


# ---- replies dropped: duplicates and undecodable ones are counted as such -----------------


class _Twice(FakeRouter):
    """A worker's act endpoint that answers every request well and then once more (its
    second reply to an act holds other rows), each act's replies after an undecodable frame
    (0xc1 is no msgpack)."""

    def reply(self, msg: dict[str, Any]) -> Any:
        if msg["cmd"] == "hello":
            result: dict[str, Any] = {
                **WELL,
                "contract": {"observations": None, "actions": None},
                "endpoints": {"observe": None},
            }
        elif msg["cmd"] == "act":
            result = {
                "actions": np.zeros((8, 3)),
                "timing": {"infer_ms": 1.0, "queue_ms": 0.0},
                "step": msg["step"],
                "episode": msg["episode"],
            }
        else:
            result = {}
        return {"id": msg["id"], "ok": True, "result": result}

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            route, *message = self.sock.recv_multipart()
            msg = framed.unpack(message)
            reply = self.reply(msg)
            if msg["cmd"] == "act":
                self.sock.send_multipart([route, b"\xc1"])
            self.sock.send_multipart([route, wire.packb(reply)])
            if msg["cmd"] == "act":
                reply["result"]["actions"] = np.ones((8, 3))
            self.sock.send_multipart([route, wire.packb(reply)])


def test_a_second_reply_is_a_duplicate_and_an_undecodable_one_is_counted(
    sockdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint = f"ipc://{sockdir}/t.sock"
    fake = _Twice(endpoint)
    fake.start()

    async def main() -> tuple[np.ndarray, dict[str, int]]:
        client = PolicyClient(endpoint, timeout_s=10)
        try:
            await client.connect()
            result = await client.act("W", 0, [0], [{}])
            # replies come in order: once this one is in, the act's second reply is too
            await client.end_episode("W")
            return result.actions, client.dropped_replies()
        finally:
            await client.close()

    try:
        with caplog.at_level(logging.WARNING, logger="robotd.link"):
            rows, dropped = _run(main)
    finally:
        fake.close()
    assert rows.tolist() == np.zeros((8, 3)).tolist()  # the first reply is the one played
    assert dropped["unknown"] == 0 and dropped["late"] == 0, dropped  # each names its request
    assert dropped["duplicate"] >= 2 and dropped["undecodable"] == 1, dropped
    said = [r.getMessage() for r in caplog.records]
    seconds = [m for m in said if m.startswith(f"dropped a second reply from {endpoint}: ")]
    assert 1 <= len(seconds) <= 2, said  # once per 10 s at most
    assert "request 1 was answered already (1 so far)" in seconds[0]
    undecodable = [m for m in said if m.startswith(f"dropped an undecodable reply from {endpoint}")]
    assert len(undecodable) == 1 and undecodable[0].endswith("(1 so far)"), said


def test_the_run_summary_counts_the_replies_dropped_by_kind(tmp_path: Path, sockdir: Path) -> None:
    """The daemon against that worker: its chunks play (the first reply of each act), and the
    summary (as telemetry: RunSummary.link_counts) counts the duplicates and the undecodable
    replies apart from late and unknown ones."""
    endpoint = f"ipc://{sockdir}/d.sock"
    fake = _Twice(endpoint)
    fake.start()
    try:
        d = Daemon(tmp_path, "--worker", endpoint, "--set", "cameras={}")
        d.wait_line(r"dropped a second reply from", timeout=60)
        d.wait_line(r"dropped an undecodable reply from", timeout=60)  # an act's, answered
        d.signal()
        assert d.wait_exit() == 0, "".join(d.log[-30:])
    finally:
        fake.close()
    s = d.result()
    assert s["duplicate_replies"] >= 2 and s["undecodable_replies"] >= 1, s
    assert s["unknown_replies"] == 0 and s["late_replies_dropped"] == 0, s
    assert s["chunks"] >= 1 and s["act_errors"] == 0, s


# ---- late answers to heartbeat pings are counted apart from late answers to acts ---------


class _SlowPings(_Twice):
    """Answers as _Twice does (once each), hello offering pings; each ping's answer is held,
    sent `late_s` after it came (the client's wait over by then) or, with late_s None, just
    before the answer to the next request. Every other request is answered at once."""

    def __init__(self, endpoint: str, late_s: float | None) -> None:
        super().__init__(endpoint)
        self.late_s = late_s
        self.held: list[tuple[float, bytes, dict[str, Any]]] = []

    def reply(self, msg: dict[str, Any]) -> Any:
        reply = super().reply(msg)
        if msg["cmd"] == "hello":
            reply["result"]["features"] = ["ping"]
        return reply

    def _send_held(self, until: float) -> None:
        while self.held and self.held[0][0] <= until:
            _, route, reply = self.held.pop(0)
            self.sock.send_multipart([route, wire.packb(reply)])

    def _serve(self) -> None:
        while not self.stop.is_set():
            self._send_held(time.monotonic())
            if not self.sock.poll(20):
                continue
            route, *message = self.sock.recv_multipart()
            msg = framed.unpack(message)
            if msg["cmd"] == "ping":
                due = time.monotonic() + self.late_s if self.late_s is not None else math.inf
                self.held.append((due, route, self.reply(msg)))
                continue
            if self.late_s is None:
                self._send_held(math.inf)
            self.sock.send_multipart([route, wire.packb(self.reply(msg))])


def test_a_late_answer_to_a_ping_is_counted_apart_from_late_replies(
    sockdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Repro: a heartbeat ping answered after its wait was counted in late_replies, the
    counter that says an act's (or another request's) answer came after it was given up."""
    endpoint = f"ipc://{sockdir}/p.sock"
    fake = _SlowPings(endpoint, late_s=None)  # answered with the next request, no sooner
    fake.start()

    try:  # end_episode is answered after the ping's late answer
        with caplog.at_level(logging.WARNING, logger="robotd.link"):
            dropped = dropped_after(endpoint, lambda c: c.ping(timeout_s=0.2))
    finally:
        fake.close()
    assert dropped["late_ping"] == 1 and dropped["late"] == 0, dropped
    assert dropped["unknown"] == 0 and dropped["duplicate"] == 0, dropped
    said = [r.getMessage() for r in caplog.records]
    late = f"dropped a late reply from {endpoint}: heartbeat ping 2 had been given up (1 so far)"
    assert late in said, said  # hello was request 1


def test_the_run_summary_counts_late_pings_apart(tmp_path: Path, sockdir: Path) -> None:
    """The daemon against a worker whose pings are answered after their 1 s wait (its acts
    at once, so it is never gone): the summary counts late_pings, and no late reply."""
    endpoint = f"ipc://{sockdir}/s.sock"
    fake = _SlowPings(endpoint, late_s=1.5)
    fake.start()
    try:
        d = Daemon(tmp_path, "--worker", endpoint, "--set", "cameras={}",
                   "--set", "policy.heartbeat_s=60")  # fmt: skip
        d.wait_line(r"dropped a late reply from .*: heartbeat ping \d+ had been given up", 60)
        d.signal()
        assert d.wait_exit() == 0, "".join(d.log[-30:])
    finally:
        fake.close()
    s = d.result()
    assert s["late_pings"] >= 1 and s["late_replies_dropped"] == 0, s
    assert s["reconnects"] == 0 and s["chunks"] >= 1, s
