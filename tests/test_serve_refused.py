"""A policy's answer the worker refuses (NaN, None, a string, the wrong shape) is told to
the robot as `bad_actions` and said in the worker's own log too, naming the episode and
step: at once, then per kind of reason at most once a period. A real `robotd serve`."""

from __future__ import annotations

import re
import time

from robotd.worker.pool import REFUSED_EVERY_S
from tests.copy_util import Worker, wait_for


def _act(worker: Worker, episode: str, step: int, answer: str) -> dict:
    msg = {"cmd": "act", "episode": episode, "step": step, "steps": [step]}
    return worker.client.request({**msg, "observations": [{"answer": answer}]})


def test_refused_answers_are_logged_by_the_worker_once_per_kind() -> None:
    worker = Worker("answer_policies:Answers", "--copies", "1")
    try:
        worker.wait_ready(1)
        began = time.monotonic()
        replies = [_act(worker, "E1", step, "nan") for step in range(4)]
        replies += [_act(worker, "E1", 4, "none"), _act(worker, "E1", 5, "str")]
        replies.append(_act(worker, "E1", 6, "flat"))  # the last: its line comes last
        took = time.monotonic() - began
        assert all(r["ok"] is False and r["error"]["code"] == "bad_actions" for r in replies)
        none = replies[4]["error"]["message"]
        assert none.startswith("infer() returned None"), none  # not "dtype object ..."
        assert _act(worker, "E1", 7, "good")["ok"] is True  # still serving
        wait_for(lambda: "step 6: the policy's answer was refused" in worker.text(), "the log")
        log = worker.text()
    finally:
        worker.stop()
    said = [line for line in log.splitlines() if "the policy's answer was refused" in line]
    assert "WARNING" in said[0] and "episode 'E1' step 0" in said[0], said
    assert "row 0 column 0 is nan" in said[0]
    assert any("episode 'E1' step 4" in s and "infer() returned None" in s for s in said), said
    assert any("step 5" in s and "infer() returned a str ('left')" in s for s in said), said
    assert any("step 6" in s and "not 2-D" in s for s in said), said
    if took < REFUSED_EVERY_S:  # the four NaN answers came within one period: said once
        assert len([s for s in said if "is nan" in s]) == 1, said
    assert not re.search(r"step 7\b.*refused", log)
