"""Window planning: the steps and keys an act reads, checked against a brute-force reference."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robotd.contract import ContractError, Observations, Stream
from robotd.link.windows import Window, WindowPlanner, assemble

ALL_KEYS = ("a", "b", "c", "d", "top", "wrist")

# A schedule in steps: ("at", offsets) | ("every", k) | ("neither", None)
Schedule = tuple[str, Any]


def reference(
    schedules: dict[str, Schedule], pad: str, t: int, prev: int | None
) -> dict[int, set[str]]:
    """Obviously-correct: for each candidate step, ask each key whether it is read there."""
    lowest = min([0] + [t + min(v) for kind, v in schedules.values() if kind == "at"])
    out: dict[int, set[str]] = {t: set()}
    for s in range(lowest, t + 1):
        for key, (kind, v) in schedules.items():
            if kind == "at":
                read = (s - t) in v and (s >= 0 or pad == "repeat_first")
            elif kind == "every":
                first = 0 if prev is None else prev + v
                read = s == t or (first <= s < t and (s - first) % v == 0)
            else:
                read = s == t
            if read:
                out.setdefault(s, set()).add(key)
    return out


def contract(schedules: dict[str, Schedule], pad: str, unit: str, hz: float) -> Observations:
    """The same schedules written as a contract, in steps or in seconds at `hz`."""
    scale = 1.0 if unit == "steps" else 1.0 / hz
    streams = {}
    for key, (kind, v) in schedules.items():
        if kind == "at":
            streams[key] = Stream(at=[o * scale for o in v])
        elif kind == "every":
            streams[key] = Stream(every=v * scale)
        else:
            streams[key] = Stream()
    return Observations(streams=streams, pad=pad, unit=unit)


schedule = st.one_of(
    st.tuples(st.just("at"), st.lists(st.integers(-25, 0), min_size=1, max_size=8, unique=True)),
    st.tuples(st.just("every"), st.integers(1, 7)),
    st.tuples(st.just("neither"), st.none()),
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Schedule], str, str, float, int, int | None]:
    schedules = draw(st.dictionaries(st.sampled_from(ALL_KEYS), schedule, min_size=1))
    t = draw(st.integers(0, 80))
    prev = draw(st.none() | st.integers(0, t - 1)) if t > 0 else None
    return (
        schedules,
        draw(st.sampled_from(["repeat_first", "drop"])),
        draw(st.sampled_from(["steps", "seconds"])),
        draw(st.sampled_from([7.0, 30.0, 50.0])),
        t,
        prev,
    )


@settings(max_examples=200, deadline=None)
@given(cases())
def test_plan_matches_reference(
    case: tuple[dict[str, Schedule], str, str, float, int, Any],
) -> None:
    schedules, pad, unit, hz, t, prev = case
    planner = WindowPlanner(contract(schedules, pad, unit, hz).resolve(hz), ALL_KEYS)
    window = planner.plan(t, prev)
    expected = reference(schedules, pad, t, prev)

    assert window.steps == tuple(sorted(expected))
    assert window.keys_at == {s: tuple(sorted(k)) for s, k in expected.items()}
    assert list(window.steps) == sorted(set(window.steps))
    assert window.steps[-1] == t == window.t
    if pad == "drop":
        assert min(window.steps) >= 0
    sources = {max(s, 0) for s, keys in expected.items() if keys}
    assert set(planner.needed(t, prev)) == sources


@settings(max_examples=200, deadline=None)
@given(cases())
def test_every_keys_at_foresees_the_next_act(case: Any) -> None:
    """Uploading every-stream keys as steps are made covers what the next act reads before t."""
    schedules, pad, unit, hz, t, prev = case
    planner = WindowPlanner(contract(schedules, pad, unit, hz).resolve(hz), ALL_KEYS)
    every_keys = {k for k, (kind, _) in schedules.items() if kind == "every"}
    window = planner.plan(t, prev)
    for s in range(0 if prev is None else prev + 1, t):
        wanted = set(window.keys_at.get(s, ())) & every_keys
        assert set(planner.every_keys_at(s, prev)) == wanted


def planner_for(pad: str = "repeat_first", **streams: Stream) -> WindowPlanner:
    return WindowPlanner(Observations(streams=streams, pad=pad).resolve(10), ALL_KEYS)


def test_first_act_of_an_episode() -> None:
    p = planner_for(a=Stream(every=3), top=Stream(at=[-4, -2, 0]))
    w = p.plan(0, None)
    assert w.steps == (-4, -2, 0)
    assert w.keys_at == {-4: ("top",), -2: ("top",), 0: ("a", "top")}
    assert set(p.needed(0, None)) == {0}
    w = planner_for("drop", a=Stream(every=3), top=Stream(at=[-4, -2, 0])).plan(0, None)
    assert w.steps == (0,) and w.keys_at == {0: ("a", "top")}


def test_every_stream_spacing_follows_the_previous_act() -> None:
    p = planner_for(a=Stream(every=3))
    assert p.plan(10, None).steps == (0, 3, 6, 9, 10)
    assert p.plan(10, 4).steps == (7, 10)
    assert p.plan(10, 8).steps == (10,)
    assert p.plan(13, 4).steps == (7, 10, 13)
    assert p.every_keys_at(7, 4) == ("a",) and p.every_keys_at(8, 4) == ()
    assert p.every_keys_at(4, 4) == ()


def test_neither_and_undeclared_read_the_own_step() -> None:
    assert planner_for(b=Stream()).plan(5, 2) == Window((5,), {5: ("b",)})
    undeclared = WindowPlanner(None, ["wrist", "a"])
    assert undeclared.plan(7, 3) == Window((7,), {7: ("a", "wrist")})
    assert undeclared.keys == ("a", "wrist") and undeclared.lookback == 0


def test_window_without_zero_still_ends_at_the_own_step() -> None:
    p = planner_for(top=Stream(at=[-3, -1]))
    w = p.plan(5, None)
    assert w.steps == (2, 4, 5) and w.keys_at[5] == ()
    assert set(p.needed(5, None)) == {2, 4}
    assert p.lookback == 3


def test_padded_steps_share_step_zero() -> None:
    p = planner_for(top=Stream(at=[-6, -3, 0]), a=Stream(at=[-1, 0]))
    assert p.needed(1, None) == {0: frozenset({"top", "a"}), 1: frozenset({"top", "a"})}
    assert p.needed(4, None) == {
        0: frozenset({"top"}),
        1: frozenset({"top"}),
        3: frozenset({"a"}),
        4: frozenset({"top", "a"}),
    }


def test_assemble_hands_each_step_its_own_keys() -> None:
    p = planner_for(top=Stream(at=[-4, 0]), a=Stream(every=2), b=Stream())
    w = p.plan(3, None)
    asked: list[tuple[int, str]] = []

    def lookup(step: int, key: str) -> str:
        asked.append((step, key))
        return f"{key}@{step}"

    out = assemble(w, lookup)
    assert out == {
        "steps": [-1, 0, 2, 3],
        "observations": [
            {"top": "top@0"},
            {"a": "a@0"},
            {"a": "a@2"},
            {"a": "a@3", "b": "b@3", "top": "top@3"},
        ],
    }
    assert all(step >= 0 for step, _ in asked)


def test_bad_steps_and_missing_keys_are_refused() -> None:
    p = planner_for(a=Stream())
    with pytest.raises(ValueError, match=r"previous act step 5 must be in 0\.\.4"):
        p.plan(5, 5)
    with pytest.raises(ValueError, match="act step t=-1"):
        p.plan(-1, None)
    obs = Observations(streams={"cam9": Stream()}).resolve(10)
    with pytest.raises(ContractError, match="'cam9' not produced by this robot"):
        WindowPlanner(obs, ["a"])


def test_an_inline_window_tells_the_tap_each_steps_frames_once() -> None:
    import numpy as np

    from robotd.link.frame_tap import tap_window

    class Tap:
        def __init__(self) -> None:
            self.got: list[tuple[str, int, list[str]]] = []

        def inlined(self, wep: str, step: int, frames: dict[str, Any]) -> None:
            self.got.append((wep, step, sorted(frames)))

    window = Window(steps=(-2, 0, 3), keys_at={-2: ("cam",), 0: ("cam",), 3: ("cam", "joints.pos")})
    frame = np.zeros((4, 4, 3), np.uint8)
    inputs = assemble(window, lambda s, k: frame if k == "cam" else np.zeros(2))
    tap = Tap()
    tap_window(tap, "w", window, inputs)
    assert tap.got == [("w", 0, ["cam"]), ("w", 3, ["cam"])]  # step -2 reads step 0's frame

    class Broken:
        def inlined(self, wep: str, step: int, frames: dict[str, Any]) -> None:
            raise RuntimeError("disk full")

    tap_window(Broken(), "w", window, inputs)  # logged, never raised into the act
    tap_window(None, "w", window, inputs)
