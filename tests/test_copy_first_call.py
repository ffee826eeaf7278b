"""A copy's first call is its policy's warm-up (JIT compilation, CUDA kernels, caches): it
may take `--first-call-s` before it counts as hung, every later call `--hang-s`. A policy
whose first act takes longer than hang_s used to be killed as hung on it, and so was every
copy started to replace it: it never served. A real `robotd serve`, real copy processes,
real ipc sockets (the policy sleeps: the slow forward pass under test)."""

from __future__ import annotations

from copy_util import Worker

from tests.test_copies import _act_msg, lost, row

SLOW_S = 2.5  # the act's forward pass: past hang_s, within first_call_s


def test_a_first_call_past_hang_s_is_a_warm_up_and_a_later_one_a_hang() -> None:
    worker = Worker(
        "copy_policies:Faulty", "--copies", "1", "--hang-s", "1", "--first-call-s", "30"
    )
    c = worker.client
    try:
        assert c.request({"cmd": "hello"})["result"]["copies"]["first_call_s"] == 30.0
        first = row(c.request(_act_msg("W1", 0, mode="sleep", seconds=SLOW_S)))
        assert first[0] == 0
        pid = worker.pid_of("W1")
        assert row(c.request(_act_msg("W1", 1)))[3] == pid
        err = lost(c.request(_act_msg("W1", 2, mode="sleep", seconds=SLOW_S)))
        assert err["cause"] == "hung" and "within 1 s" in err["message"], err
        assert "first call" not in err["message"]
        health = c.ping()
        assert health["counts"]["copies_lost"] == 1
    finally:
        worker.stop()


def test_a_first_call_past_first_call_s_is_a_hang_said_as_such() -> None:
    worker = Worker(
        "copy_policies:Faulty", "--copies", "1", "--hang-s", "0.5", "--first-call-s", "1"
    )
    c = worker.client
    try:
        err = lost(c.request(_act_msg("H1", 0, mode="hang")))
        assert err["cause"] == "hung", err
        assert "within 1 s (its first call: first_call_s; later ones hang_s)" in err["message"]
    finally:
        worker.stop()
