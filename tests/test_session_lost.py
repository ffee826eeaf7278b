"""A lost episode is told to the lane and logged once, however often the worker says so.

The heartbeat asks the worker about the running episode every 20 ms, and the act that
failed says it too; when the lane does not move on at once (the episode ended meanwhile,
starved: it ignores a loss outside RUNNING) every ping said "lost" again, and each was a
warning: ~40 lines a second until the next episode. The session here is the real one
(robotd.link.session.PolicySession on the sim config), not connected: the two ways a loss
reaches it are called as the heartbeat and the act path call them.
"""

from __future__ import annotations

import logging

from robotd.config import load_config
from robotd.lane.messages import EpisodeLost, Step
from robotd.link.session import PolicySession


def _step(wep: str, s: int) -> Step:
    return Step(1, wep, s, 1_000 + s, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], {}, True)


def test_a_loss_said_again_and_again_is_told_and_logged_once_per_episode(caplog) -> None:
    sent: list[object] = []
    session = PolicySession(load_config(None, []), "ipc:///nonexistent", rings={},
                            send_down=sent.append, worker_failed=lambda: "")
    session.on_step(_step("run-1", 0))
    with caplog.at_level(logging.WARNING, logger="robotd.link"):
        session.episode_lost("run-1", "episode 'run-1' lost: copy 2 hung")  # the act's error
        for _ in range(500):  # 10 s of heartbeats, the lane still on run-1
            session.episode_lost("run-1", "hung: episode 'run-1' lost: copy 2 hung")
        session.on_step(_step("run-2", 0))  # the lane moved on; that one is lost too
        for _ in range(3):
            session.episode_lost("run-2", "crashed")
        session.episode_lost("run-1", "late word about the old one")  # not the running one
    lines = [r.getMessage() for r in caplog.records if "lost episode" in r.getMessage()]
    assert lines == ["the policy lost episode run-1: episode 'run-1' lost: copy 2 hung",
                     "the policy lost episode run-2: crashed"], lines
    assert [type(m) for m in sent] == [EpisodeLost, EpisodeLost]
