"""A worker-side episode lost while rows of its chunk are still queued (docs/contract.md,
"episode resets"): by default they are flushed and never played, the robot holds until the
new episode's first chunk and the new episode counts from step 0; `control.on_reset =
"finish_chunk"` lets them play out as the new episode's first steps instead."""

from __future__ import annotations

import numpy as np
import pytest

from robotd.control.playback import Chunk
from tests.test_kernel import Rig, started

TIMINGS = ['control.timing="sync"', 'control.timing="realtime"']
# The first chunk: rows no hold or later chunk comes near (each step well inside max_velocity).
OLD_ROWS = np.linspace(0.1, 0.4, 24).reshape(8, 3)


def playing(*overrides: str) -> tuple[Rig, list[np.ndarray], np.ndarray]:
    """An episode that played two rows of its first chunk and still has rows of it queued.
    Returns the rig, the targets written so far and a copy of the queued rows."""
    rig = started(*overrides)
    targets = [rig.tick()]
    (ask,) = rig.asks()
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], OLD_ROWS))
    targets += [rig.tick(), rig.tick()]
    assert any(np.allclose(targets[-1], r) for r in OLD_ROWS)  # played from the chunk
    queued = rig.k.playback.queue.peek().copy()
    assert len(queued) >= 2  # the precondition: rows of the old episode wait in the queue
    return rig, targets, queued


def is_one_of(target: np.ndarray | None, rows: np.ndarray) -> bool:
    return target is not None and any(np.allclose(target, r, atol=1e-9) for r in rows)


def since(rig: Rig, mark: int, kind: str) -> list[dict]:
    return [m for m in rig.out[mark:] if m["k"] == kind]


@pytest.mark.parametrize("timing", TIMINGS)
def test_queued_rows_of_a_lost_episode_are_flushed_and_never_played(timing: str):
    rig, targets, queued = playing(timing)
    last, old_wep = targets[-1].copy(), rig.k.wep
    mark, holds = len(rig.out), rig.k.counters.holds
    rig.k.episode_lost("copy crashed: killed by SIGKILL")
    (reset,) = rig.events("episode_reset")
    assert reset["flushed"] == len(queued) and reset["old_wep"] == old_wep
    assert rig.k.counters.episode_resets == 1 and rig.k.wep != old_wep

    waiting = [rig.tick() for _ in range(5)]  # no answer yet: the robot holds where it is
    assert all(np.allclose(t, last) for t in waiting)
    assert rig.k.counters.holds == holds + 5
    steps = since(rig, mark, "step")
    assert [s["s"] for s in steps] == [0, 1, 2, 3, 4]
    assert {s["wep"] for s in steps} == {rig.k.wep}
    (ask,) = since(rig, mark, "ask")  # the new episode asks at its step 0
    assert ask["s"] == 0 and ask["wep"] == rig.k.wep

    new_rows = last - 0.02 - 0.005 * np.arange(16)[:, None]
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], new_rows))
    after = [rig.tick() for _ in range(12)]
    assert is_one_of(after[0], new_rows)  # the first tick after the chunk plays from it
    assert not any(is_one_of(t, queued) for t in waiting + after)


@pytest.mark.parametrize("timing", TIMINGS)
def test_finish_chunk_plays_the_queued_rows_out_where_the_default_holds(timing: str):
    outcome = {}
    for on_reset in ("hold", "finish_chunk"):
        rig, _, queued = playing(timing, f'control.on_reset="{on_reset}"')
        mark, holds = len(rig.out), rig.k.counters.holds
        rig.k.episode_lost("copy hung")
        (reset,) = rig.events("episode_reset")
        written = [rig.tick() for _ in range(len(queued))]
        steps = since(rig, mark, "step")
        assert [s["s"] for s in steps] == list(range(len(queued)))  # from 0 either way
        assert {s["wep"] for s in steps} == {rig.k.wep} and rig.k.counters.episode_resets == 1
        outcome[on_reset] = (reset["flushed"], written, rig.k.counters.holds - holds, queued)

    flushed, written, held, queued = outcome["hold"]
    assert flushed == len(queued) and held == len(queued)
    assert not any(is_one_of(t, queued) for t in written)
    flushed, written, held, queued = outcome["finish_chunk"]
    # the rows play in order as the new episode's first steps, not a tick held between
    assert flushed == 0 and held == 0
    assert np.allclose(np.array(written), queued)
