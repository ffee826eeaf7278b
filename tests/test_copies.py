"""Copies of the policy in child processes: a real `robotd serve`, real copy processes, real
signals (kill -9, a hang, an address-space limit), real ipc sockets."""

from __future__ import annotations

import math
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import numpy as np
import pytest
from copy_util import Client, Worker, serve_fails, wait_for

from robotd import wire
from robotd.link.client import PolicyClient, PolicyError


@pytest.fixture
def spare() -> Iterator[Worker]:
    """Two copies (one a warm spare); hangs are not looked for within these tests."""
    worker = Worker("copy_policies:Faulty", "--copies", "2", "--hang-s", "60")
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def steady() -> Iterator[Worker]:
    """Two copies shared by the tests that lose none (each uses its own episode ids)."""
    worker = Worker("copy_policies:Faulty", "--copies", "2", "--hang-s", "60")
    try:
        yield worker
    finally:
        worker.stop()


def row(reply: dict) -> list[float]:
    assert reply["ok"], reply
    return list(reply["result"]["actions"][0])


def lost(reply: dict) -> dict:
    assert reply["ok"] is False and reply["error"]["code"] == "episode_lost", reply
    return reply["error"]


def test_kill_9_mid_episode_loses_the_episode_and_the_spare_takes_the_next(spare: Worker) -> None:
    c = spare.client
    before = {x["pid"] for x in spare.wait_ready(2)["copies"]}
    assert row(c.request(_act_msg("K1", 0)))[0] == 0
    victim = spare.pid_of("K1")
    in_flight = c.act("K1", 1, mode="sleep", seconds=60)
    wait_for(lambda: _busy(c, victim), "the act in the copy")
    os.kill(victim, signal.SIGKILL)
    err = lost(c.recv(in_flight))  # the act in flight
    assert "SIGKILL" in err["message"] and err["signal"] == "SIGKILL"
    assert err["cause"] in ("killed", "out_of_memory") and "K1" in err["message"]
    err = lost(c.request(_act_msg("K1", 2)))  # and the episode's next act
    assert "SIGKILL" in err["message"]
    # A new episode goes at once to the spare that was ready before the kill.
    first = row(c.request(_act_msg("K2", 0)))
    assert first[0] == 0 and first[1] == 1  # steps and state start afresh
    assert int(first[3]) in before - {victim}
    health = c.ping("K1")
    assert health["episode"]["state"] == "lost" and "SIGKILL" in health["episode"]["cause"]
    assert health["counts"]["episodes_lost"] == 1 and health["counts"]["copies_lost"] == 1
    assert health["last_loss"]["episode"] == "K1"
    replaced = spare.wait_ready(2)  # a new copy replaces the lost one
    assert victim not in {x["pid"] for x in replaced["copies"]}
    assert replaced["counts"]["copies_started"] == 3


def _act_msg(episode: str, step: int, **obs: object) -> dict:
    return {"cmd": "act", "episode": episode, "step": step, "steps": [step], "observations": [obs]}


def _busy(c: Client, pid: int) -> bool:
    return any(x["pid"] == pid and x["state"] == "busy" for x in c.ping()["copies"])


def test_a_hung_copy_is_killed_within_hang_s_while_pings_go_on() -> None:
    worker = Worker("copy_policies:Faulty", "--copies", "1", "--hang-s", "1.5")
    c = worker.client
    try:
        assert row(c.request(_act_msg("H1", 0)))[0] == 0
        victim = worker.pid_of("H1")
        started = time.monotonic()
        hung = c.act("H1", 1, mode="hang")
        pings_while_busy = 0
        while hung not in c.replies:
            health = c.ping(timeout=5)  # the poll loop answers while the copy hangs
            copies = health["copies"]
            pings_while_busy += any(x["state"] == "busy" and x["episode"] == "H1" for x in copies)
            c.sock.poll(50)  # waits on the socket for the act's answer (or the next ping)
        reply = c.recv(hung)
        elapsed = time.monotonic() - started
        err = lost(reply)
        assert err["cause"] == "hung" and "hung" in err["message"] and "1.5 s" in err["message"]
        assert elapsed >= 1.5 and pings_while_busy >= 1
        wait_for(lambda: not _alive(victim), "the hung copy killed")
        # With one copy, a new episode waits for the replacement and is served by it.
        fresh = row(c.request(_act_msg("H2", 0)))
        assert int(fresh[3]) != victim and fresh[0] == 0
    finally:
        worker.stop()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_copy_out_of_memory_loses_its_episode_naming_memory() -> None:
    worker = Worker(
        "copy_policies:Faulty",
        "--copies",
        "1",
        "--copy-memory-mib",
        "1536",
        "--arg",
        "hog_mib=4096",
    )
    c = worker.client
    try:
        err = lost(c.request(_act_msg("M1", 0, mode="oom")))
        assert err["cause"] == "out_of_memory" and "memory" in err["message"]
        assert "MemoryError" in err["message"]
        assert row(c.request(_act_msg("M2", 0)))[0] == 0  # the replacement serves
    finally:
        worker.stop()


@pytest.mark.parametrize(
    ("mode", "needle", "cause"),
    [("exit", "exited with code 3", "crashed"), ("segv", "SIGSEGV", "crashed")],
)
def test_a_crashing_copy_is_told_apart(spare: Worker, mode: str, needle: str, cause: str) -> None:
    c = spare.client
    err = lost(c.request(_act_msg("C1", 0, mode=mode)))
    assert needle in err["message"] and err["cause"] == cause
    if mode == "exit":
        assert err["exit_code"] == 3 and err["signal"] is None
    assert row(c.request(_act_msg("C2", 0)))[0] == 0


def test_a_policy_that_raises_is_a_policy_error_and_its_copy_goes_on(steady: Worker) -> None:
    c = steady.client
    assert row(c.request(_act_msg("R1", 0)))[1] == 1
    pid = steady.pid_of("R1")
    reply = c.request(_act_msg("R1", 1, mode="raise"))
    assert reply["error"]["code"] == "policy_error"
    assert "RuntimeError: asked to raise" in reply["error"]["message"]
    again = row(c.request(_act_msg("R1", 2)))
    assert int(again[3]) == pid and again[1] == 2  # same copy, same episode state
    assert c.ping()["counts"]["episodes_lost"] == 0
    assert c.request({"cmd": "end_episode", "episode": "R1"})["ok"]


def test_episode_state_persists_across_acts_and_is_fresh_for_the_next(steady: Worker) -> None:
    c = steady.client
    rows = [row(c.request(_act_msg("S1", s))) for s in range(3)]
    assert [r[0] for r in rows] == [0, 1, 2]  # steps answered so far
    assert [r[1] for r in rows] == [1, 2, 3]  # the policy's own count in episode.state
    assert all(r[6] == 1.0 for r in rows)  # the Episode is also its id string
    assert c.request({"cmd": "end_episode", "episode": "S1"})["ok"]
    fresh = row(c.request(_act_msg("S2", 0)))
    assert fresh[0] == 0 and fresh[1] == 1


def test_hello_lists_the_params_and_params_apply_from_the_next_episode(steady: Worker) -> None:
    c = steady.client
    hello = c.request({"cmd": "hello"})["result"]
    assert set(hello["features"]) >= {"ping", "params", "episode_lost"}
    assert hello["copies"] == {
        "count": 2,
        "isolated": True,
        "inline": False,
        "hang_s": 60.0,
        "first_call_s": 60.0,
    }
    params = {p["name"]: p for p in hello["params"]}
    assert set(params) == {"gain", "label", "fast", "speed", "limit"}  # not `buffer`
    assert params["gain"] == {
        "name": "gain",
        "type": "float",
        "default": 1.0,
        "nullable": False,
        "choices": None,
        "value": 1.0,
    }
    assert params["speed"]["choices"] == ["slow", "quick"] and params["limit"]["nullable"]
    assert row(c.request(_act_msg("P1", 0)))[2] == 1.0
    done = c.request({"cmd": "params", "set": {"gain": 3, "fast": True}})
    assert done["ok"] and done["result"]["applies"] == "next_episode"
    assert {p["name"]: p["value"] for p in done["result"]["params"]}["gain"] == 3.0
    assert row(c.request(_act_msg("P1", 1)))[2] == 1.0  # never mid-episode
    nxt = row(c.request(_act_msg("P2", 0)))
    assert nxt[2] == 3.0 and nxt[7] == 1.0
    got = {p["name"]: p["value"] for p in c.request({"cmd": "hello"})["result"]["params"]}
    assert got["gain"] == 3.0 and got["fast"] is True


BAD_PARAMS = [
    ({"gian": 2.0}, "field 'set.gian': unknown parameter (known: fast, gain, label, limit,"),
    ({"gain": "fast"}, "field 'set.gain': 'fast' (str) is not of type float"),
    ({"gain": True}, "field 'set.gain'"),
    ({"gain": math.nan}, "not a finite number"),
    ({"fast": 1}, "field 'set.fast'"),
    ({"speed": "warp"}, "not one of ['slow', 'quick']"),
    ({"label": None}, "None is not allowed"),
    ({"label": "x" * 5000}, "at most 1024"),
    ([1, 2], "field 'set': not a map"),
    ({"gain": 2.0, "nope": 1}, "'set.nope'"),
]


def test_bad_params_are_refused_naming_the_field(steady: Worker) -> None:
    c = steady.client

    def values() -> dict:
        return {p["name"]: p["value"] for p in c.request({"cmd": "params"})["result"]["params"]}

    before = values()
    for given, needle in BAD_PARAMS:
        reply = c.request({"cmd": "params", "set": given})
        assert reply["ok"] is False and reply["error"]["code"] == "bad_params", (given, reply)
        assert needle in reply["error"]["message"], (given, reply)
    assert values() == before  # nothing partly applied


def test_hostile_requests_get_error_replies_and_the_worker_goes_on(steady: Worker) -> None:
    c = steady.client
    for msg, code, needle in [
        ({"cmd": "ping", "episode": 5}, "bad_request", "field 'episode'"),
        ({"cmd": "ping", "episode": "x" * 300}, "bad_request", "field 'episode'"),
        ({"cmd": "warp"}, "unknown_command", "hello, act, end_episode, ping, params"),
        ({"cmd": "act", "episode": "Q", "step": 0, "steps": [0]}, "bad_request", "observations"),
    ]:
        reply = c.request(msg)
        assert reply["ok"] is False and reply["error"]["code"] == code, reply
        assert needle in reply["error"]["message"]
    c.send_raw(wire.packb({"id": 77, "cmd": "ping", "extra": np.zeros((2, 2))}))
    assert c.recv(77)["ok"]  # unknown fields are ignored
    assert c.ping("never-seen")["episode"]["state"] == "unknown"
    assert row(c.request(_act_msg("Q", 0)))[0] == 0


def test_a_lost_episode_stays_lost_and_ends_quietly(spare: Worker) -> None:
    c = spare.client
    lost(c.request(_act_msg("L1", 0, mode="exit")))
    named = {"cmd": "act", "episode": "L1", "step": 1, "steps": [1], "reads": [["x"]]}
    err = lost(c.request(named))  # answered at once, not after waiting for uploads
    assert "exited with code 3" in err["message"]
    ended = c.request({"cmd": "end_episode", "episode": "L1"})
    assert ended["ok"] is True and ended["result"] == {}
    lost(c.request(_act_msg("L1", 2)))


def test_the_daemons_client_is_served_by_copy_processes(spare: Worker) -> None:
    async def main() -> None:
        client = PolicyClient(spare.endpoint, timeout_s=30)
        hello = await client.connect()
        assert hello.observations is None and hello.policy == "copy_policies:Faulty"
        result = await client.act("D1", 4, [4], [{"v": 1}])
        assert result.step == 4 and result.actions.shape == (1, 8)
        assert result.infer_ms >= 0 and result.queue_ms >= 0
        await client.end_episode("D1")
        with pytest.raises(PolicyError) as err:
            await client.act("D2", 0, [0], [{"mode": "exit"}])
        assert err.value.code == "episode_lost" and "exited with code 3" in err.value.message
        await client.close()

    anyio.run(main, backend_options={"use_uvloop": True})


def test_a_copy_that_cannot_be_rebuilt_is_retried_and_acts_hear_why(tmp_path) -> None:
    marker = tmp_path / "built"
    worker = Worker("copy_policies:BrokenOnReload", "--arg", f"marker={str(marker)!r}")
    c = worker.client
    try:
        lost(c.request(_act_msg("B1", 0, mode="exit")))
        reply = wait_for(
            lambda: (
                (r := c.request(_act_msg("B2", 0)))["ok"] is False
                and r["error"]["code"] == "no_copy"
                and r
            ),
            "no_copy",
        )
        assert "cannot build twice" in reply["error"]["message"]
        health = c.ping()
        assert health["counts"]["start_failures"] >= 1
        assert "cannot build twice" in health["last_start_error"]
    finally:
        worker.stop()


def test_a_policy_that_cannot_load_fails_serve_with_the_reason() -> None:
    # The marker exists already: the first copy cannot be built.
    code, text = serve_fails("copy_policies:BrokenOnReload", "--arg", "marker='/proc/self'")
    assert code == 2 and "constructor failed: RuntimeError: cannot build twice" in text
    code, text = serve_fails("copy_policies:Faulty", "--copies", "-1")
    assert code == 2 and "copies: -1 is not in 0..64" in text


def test_copies_go_when_the_worker_is_killed() -> None:
    worker = Worker("copy_policies:Faulty", "--copies", "2")
    pids = [c["pid"] for c in worker.wait_ready(2)["copies"]]
    worker.client.close()
    worker.proc.kill()  # no clean-up of its own: the kernel tells the copies (PDEATHSIG)
    worker.proc.wait()
    for pid in pids:
        wait_for(lambda p=pid: not _alive(p), f"copy {pid} gone")
    shutil.rmtree(worker.dir, ignore_errors=True)
    # Copies talk over socket pairs: a killed worker leaves no socket file behind.
    assert not list(Path(tempfile.gettempdir()).glob(f"robotd-copies-{worker.proc.pid}-*"))


def test_a_hung_thread_copy_is_reported_and_replaced() -> None:
    """--copies 0 (no isolation): the hung thread cannot be killed, but its episode is lost
    all the same, a new thread copy serves, and the worker still stops cleanly."""
    worker = Worker("copy_policies:Faulty", "--copies", "0", "--hang-s", "1", "--first-call-s", "1")
    c = worker.client
    try:
        assert c.request({"cmd": "hello"})["result"]["copies"]["isolated"] is False
        err = lost(c.request(_act_msg("T1", 0, mode="hang")))
        assert err["cause"] == "hung"
        fresh = row(c.request(_act_msg("T2", 0)))
        assert fresh[0] == 0 and int(fresh[3]) == worker.proc.pid  # in the worker itself
        assert fresh[4] == 1  # a new policy instance: its first reset
    finally:
        worker.stop()


def test_calls_queued_for_a_copy_are_bounded_and_all_answered_when_it_hangs() -> None:
    worker = Worker("copy_policies:Faulty", "--copies", "1", "--hang-s", "2", "--first-call-s", "2")
    c = worker.client
    try:
        first = c.act("Q1", 0, mode="hang")
        wait_for(lambda: c.ping()["pool"]["busy"] == 1, "the copy computing")
        queued = [c.act("Q1", s) for s in range(1, 71)]
        codes = [c.recv(rid)["error"]["code"] for rid in [first, *queued]]
        assert codes.count("busy") == 70 - 64 and codes.count("episode_lost") == 65
        assert set(codes[-6:]) == {"busy"}  # the ones over the bound, answered at once
        assert row(c.request(_act_msg("Q2", 0)))[0] == 0
    finally:
        worker.stop()


def test_an_act_waiting_for_uploads_hears_at_once_that_its_episode_was_lost(spare: Worker) -> None:
    c = spare.client
    assert row(c.request(_act_msg("W1", 0)))[0] == 0
    victim = spare.pid_of("W1")
    named = {"cmd": "act", "episode": "W1", "step": 1, "steps": [1], "reads": [["x"]]}
    parked = c.send({**named, "wait_s": 600})  # "x" is never uploaded
    wait_for(lambda: c.ping()["queued"] == 1, "the act parked")
    os.kill(victim, signal.SIGKILL)
    assert "SIGKILL" in lost(c.recv(parked))["message"]
