"""`robotd serve --inline`: the policy called in the worker's poll loop (a real worker
process, real ipc sockets). Nothing isolates it, so what a policy does wrong in Python
(raise, SystemExit) must be answered as an error and the worker must serve on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from copy_util import Worker, serve_fails


@pytest.fixture(scope="module")
def inline() -> Iterator[Worker]:
    worker = Worker("copy_policies:Faulty", "--inline")
    try:
        yield worker
    finally:
        worker.stop()


def _act(episode: str, step: int, **obs: object) -> dict:
    return {"cmd": "act", "episode": episode, "step": step, "steps": [step], "observations": [obs]}


def _row(reply: dict) -> list[float]:
    assert reply["ok"], reply
    return list(reply["result"]["actions"][0])


def test_hello_says_the_policy_runs_inline_without_isolation(inline: Worker) -> None:
    copies = inline.client.request({"cmd": "hello"})["result"]["copies"]
    assert copies["inline"] is True and copies["isolated"] is False and copies["count"] == 0


def test_acts_run_in_the_worker_itself_with_episode_state(inline: Worker) -> None:
    c = inline.client
    rows = [_row(c.request(_act("I1", s))) for s in range(3)]
    assert {int(r[3]) for r in rows} == {inline.proc.pid}  # no copy process, no thread hop
    assert [r[0] for r in rows] == [0, 1, 2] and [r[1] for r in rows] == [1, 2, 3]
    resets = rows[0][4]
    assert c.request({"cmd": "end_episode", "episode": "I1"})["ok"]
    fresh = _row(c.request(_act("I2", 0)))
    assert fresh[0] == 0 and fresh[1] == 1 and fresh[4] == resets + 1  # reset for the new one
    ended = c.request(_act("I1", 3))
    assert ended["ok"] is False and ended["error"]["code"] == "episode_ended"


@pytest.mark.parametrize(
    ("mode", "needle"), [("raise", "RuntimeError: asked to raise"), ("sys_exit", "exit(4)")]
)
def test_a_policy_that_raises_or_exits_is_an_error_and_the_worker_goes_on(
    inline: Worker, mode: str, needle: str
) -> None:
    c = inline.client
    episode = f"E-{mode}"
    assert _row(c.request(_act(episode, 0)))[1] == 1
    reply = c.request(_act(episode, 1, mode=mode))
    assert reply["ok"] is False and reply["error"]["code"] == "policy_error"
    assert needle in reply["error"]["message"]
    again = _row(c.request(_act(episode, 2)))
    assert again[1] == 2 and int(again[3]) == inline.proc.pid  # same episode state
    assert inline.proc.poll() is None and c.ping()["counts"]["episodes_lost"] == 0


def test_inline_takes_no_copies_and_a_policy_that_cannot_load_fails_serve() -> None:
    code, text = serve_fails("copy_policies:Faulty", "--inline", "--copies", "2")
    assert code == 2 and "inline runs one copy in the worker: copies is 2, not 0" in text
    code, text = serve_fails("copy_policies:NoSuchPolicy", "--inline")
    assert code != 0 and "NoSuchPolicy" in text
