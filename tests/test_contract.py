"""The observation/action contracts: every rule's message, resolving, the wire form."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from robotd.contract import (
    Actions,
    Camera,
    ContractError,
    Observations,
    ResolvedStream,
    Stream,
    differences,
)


def error_of(d: Any, cls: Any = Observations) -> str:
    with pytest.raises(ContractError) as info:
        cls.from_wire(d)
    return str(info.value)


def one_stream(**stream: Any) -> dict[str, Any]:
    return {"streams": {"top": stream}}


# ---- construction ---------------------------------------------------------------------


def test_keyword_construction_and_defaults() -> None:
    obs = Observations(streams={"top": Stream(at=[-15, 0]), "joints.pos": Stream()})
    assert obs.streams["top"].at == [-15.0, 0.0]
    assert (obs.unit, obs.pad, obs.when_behind, obs.every) == (
        "steps",
        "repeat_first",
        "wait",
        None,
    )
    r = obs.resolve(50)
    assert r.streams["top"] == ResolvedStream(at=(-15, 0), every=None)
    assert r.streams["joints.pos"] == ResolvedStream(at=(0,), every=None)
    assert r.keys == ("joints.pos", "top")
    assert r.max_lookback == 15


def test_models_are_immutable() -> None:
    obs = Observations(streams={"top": Stream(at=[-1, 0])})
    with pytest.raises(ValueError):
        obs.unit = "seconds"  # type: ignore[misc]


def test_contract_error_is_a_value_error_with_problem_lines() -> None:
    with pytest.raises(ValueError) as info:
        Observations.from_wire({"streams": {"a": {"at": [1]}, "b": {"every": 0}}})
    assert isinstance(info.value, ContractError)
    assert info.value.problems == [
        "observations.streams['a'].at: offset 1 > 0 (offsets must be <= 0)",
        "observations.streams['b'].every: every 0 must be > 0",
    ]


# ---- each rule names the key and the rule ---------------------------------------------


def test_offset_above_zero() -> None:
    msg = error_of(one_stream(at=[3, 0]))
    assert msg == "observations.streams['top'].at: offset 3 > 0 (offsets must be <= 0)"


def test_duplicate_offset() -> None:
    msg = error_of(one_stream(at=[-2, -2, 0]))
    assert "observations.streams['top'].at: duplicate offset -2 (each offset once)" in msg


def test_at_and_every_both_set() -> None:
    msg = error_of(one_stream(at=[0], every=2))
    assert "observations.streams['top']: at and every both set" in msg


@pytest.mark.parametrize("every", [0, -3])
def test_every_not_positive(every: int) -> None:
    msg = error_of(one_stream(every=every))
    assert f"observations.streams['top'].every: every {every} must be > 0" in msg


def test_default_every_not_positive() -> None:
    assert "observations.every: every 0 must be > 0" in error_of({"every": 0})


def test_fractional_offset_with_unit_steps() -> None:
    msg = error_of(one_stream(at=[-1.5, 0]))
    assert "observations.streams['top'].at: offset -1.5 is not a whole number of steps" in msg


def test_fractional_every_with_unit_steps() -> None:
    msg = error_of(one_stream(every=2.5))
    assert "observations.streams['top'].every: every 2.5 is not a whole number of steps" in msg
    assert "observations.every: every 0.5 is not a whole number" in error_of({"every": 0.5})


def test_fractions_are_fine_in_seconds() -> None:
    obs = Observations.from_wire({"unit": "seconds", "streams": {"top": {"at": [-1.5, 0]}}})
    assert obs.resolve(10).streams["top"].at == (-15, 0)


def test_whole_floats_are_fine_in_steps() -> None:
    assert Observations.from_wire(one_stream(at=[-3.0, 0.0])).resolve(1).streams["top"].at == (
        -3,
        0,
    )


@pytest.mark.parametrize("key", ["", "   "])
def test_empty_key(key: str) -> None:
    msg = error_of({"streams": {key: {}}})
    assert f"observations.streams[{key!r}]: empty key" in msg


def test_stream_count_limit() -> None:
    Observations.from_wire({"streams": {f"k{i}": {} for i in range(64)}})
    msg = error_of({"streams": {f"k{i}": {} for i in range(65)}})
    assert msg == "observations.streams: 65 streams (at most 64)"


def test_window_size_limit() -> None:
    Observations.from_wire(one_stream(at=list(range(-255, 1))))
    msg = error_of(one_stream(at=list(range(-256, 1))))
    assert "observations.streams['top'].at: window of 257 entries (at most 256)" in msg


def test_empty_window() -> None:
    assert "observations.streams['top'].at: empty window" in error_of(one_stream(at=[]))


def test_camera_rules() -> None:
    msg = error_of(one_stream(camera={"width": 224}))
    assert "observations.streams['top'].camera: width and height go together" in msg
    msg = error_of(one_stream(camera={"width": 0, "height": 10}))
    assert "observations.streams['top'].camera.width: 0 out of range (must be 1..16384)" in msg
    # each side within bounds, the frame not: 805 MB a frame, fitted and sent every step
    msg = error_of(one_stream(camera={"width": 16384, "height": 16384}))
    assert (
        "observations.streams['top'].camera: 16384x16384 is 268435456 pixels, over "
        "33554432 (8192x4096)" in msg
    )
    Observations.from_wire(one_stream(camera={"width": 7680, "height": 4320}))  # 8K UHD
    for q in (0, 101):
        msg = error_of(one_stream(camera={"quality": q}))
        where = "observations.streams['top'].camera.quality"
        assert f"{where}: {q} out of range (must be 1..100)" in msg
    msg = error_of(one_stream(camera={"codec": "webp"}))
    assert "observations.streams['top'].camera.codec:" in msg and "'webp'" in msg


def test_type_errors_carry_the_index_path() -> None:
    msg = error_of(one_stream(at=[-1, "x"]))
    assert msg.startswith("observations.streams['top'].at[1]: Input should be a valid number")
    assert "observations.streams['top'].at[0]:" in error_of(one_stream(at=[True]))
    assert "observations.streams['top'].at[0]: Input should be a finite number" in error_of(
        one_stream(at=[float("nan")])
    )


def test_unknown_fields_and_values() -> None:
    assert "observations.streams['top'].offsets: unknown field" in error_of(one_stream(offsets=[0]))
    assert "observations.colour: unknown field" in error_of({"colour": 1})
    assert "observations.unit:" in error_of({"unit": "minutes"})
    assert "observations.streams[3] (the key itself)" in error_of({"streams": {3: {}}})


def test_not_a_mapping_names_where() -> None:
    with pytest.raises(ContractError, match=r"^config\.observations: expected a mapping, got list"):
        Observations.from_wire([1], where="config.observations")


def test_nested_keyword_construction_names_the_key_once() -> None:
    with pytest.raises(ContractError) as info:
        Observations(streams={"top": {"at": [2]}})  # type: ignore[dict-item]
    assert str(info.value) == "observations.streams['top'].at: offset 2 > 0 (offsets must be <= 0)"
    # a Stream's rules are checked where it gets its key: in the Observations that holds it
    with pytest.raises(ContractError, match=r"^observations\.streams\['top'\]\.at: offset 1 > 0"):
        Observations(streams={"top": Stream(at=[1])})
    with pytest.raises(ContractError, match=r"^camera\.quality: 0 out of range"):
        Camera(quality=0)


def test_actions_rules() -> None:
    assert Actions.from_wire({"key": "actions", "hz": 50, "open_loop_horizon": 8}).hz == 50.0
    msg = error_of({"key": "", "hz": 0, "open_loop_horizon": 0}, Actions)
    assert "actions.key: empty key" in msg
    assert "actions.hz: hz 0 must be > 0" in msg
    assert "actions.open_loop_horizon: open_loop_horizon 0 must be >= 1" in msg
    assert "actions.open_loop_horizon: Input should be a valid integer" in error_of(
        {"open_loop_horizon": 2.5}, Actions
    )


# ---- resolving --------------------------------------------------------------------------


def test_seconds_round_to_nearest_ties_away_from_zero() -> None:
    obs = Observations.from_wire(
        {
            "unit": "seconds",
            "streams": {
                "top": {"at": [-1.0, -0.25, -0.04, 0]},  # -10, -2.5 -> -3, -0.4 -> 0 ... duplicate
            },
        }
    )
    with pytest.raises(ContractError) as info:
        obs.resolve(10)
    assert str(info.value) == (
        "observations.streams['top'].at: offsets -0.04 s and 0 s both "
        "round to step 0 at 10 Hz (each offset once)"
    )
    obs = Observations.from_wire(
        {
            "unit": "seconds",
            "streams": {"top": {"at": [-1.0, -0.25, -0.06, 0]}, "j": {"every": 0.1}},
        }
    )
    r = obs.resolve(10)
    assert r.streams["top"].at == (-10, -3, -1, 0)
    assert r.streams["j"].every == 1
    assert obs.resolve(30).streams["j"].every == 3
    assert r.hz == 10.0 and r.max_lookback == 10


def test_every_rounding_to_zero_steps() -> None:
    obs = Observations.from_wire({"unit": "seconds", "streams": {"j": {"every": 0.01}}})
    with pytest.raises(ContractError, match=r"streams\['j'\]\.every: 0\.01 s rounds to 0 steps"):
        obs.resolve(20)


def test_default_every_applies_to_streams_with_neither() -> None:
    obs = Observations.from_wire(
        {"every": 2, "streams": {"a": {}, "b": {"at": [-1, 0]}, "c": {"every": 5}}}
    )
    r = obs.resolve(10)
    assert r.streams["a"] == ResolvedStream(at=None, every=2)
    assert r.streams["b"] == ResolvedStream(at=(-1, 0), every=None)
    assert r.streams["c"] == ResolvedStream(at=None, every=5)


def test_resolve_rejects_bad_rate_and_huge_values() -> None:
    obs = Observations(streams={"a": Stream(at=[-5, 0])})
    for hz in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ContractError, match="control rate hz"):
            obs.resolve(hz)
    big = Observations.from_wire({"unit": "seconds", "streams": {"a": {"at": [-1e300, 0]}}})
    with pytest.raises(ContractError) as info:
        big.resolve(100)
    assert info.value.problems == [
        "observations.streams['a'].at: -1e+300 s at 100 Hz is beyond 10000000 steps "
        "(too far to keep)"
    ]
    far = Observations.from_wire({"streams": {"a": {"every": 2e7}}})
    with pytest.raises(ContractError, match=r"streams\['a'\]\.every: 20000000 is beyond"):
        far.resolve(100)


# ---- wire -------------------------------------------------------------------------------

contracts = st.builds(
    lambda streams, unit, pad, behind: {
        "streams": streams,
        "unit": unit,
        "pad": pad,
        "when_behind": behind,
    },
    st.dictionaries(
        st.text(min_size=1, max_size=8).filter(str.strip),
        st.one_of(
            st.builds(
                lambda at: {"at": sorted(at)},
                st.sets(st.integers(-300, 0), min_size=1, max_size=20),
            ),
            st.builds(lambda k: {"every": k}, st.integers(1, 50)),
            st.builds(
                lambda w, h, q, c: {
                    "camera": {
                        "width": w,
                        "height": h,
                        "quality": q,
                        "codec": c,
                        "layout": "chw_float",
                    }
                },
                st.integers(1, 4000),
                st.integers(1, 4000),
                st.integers(1, 100),
                st.sampled_from(["jpeg", "png", "raw"]),
            ),
            st.just({}),
        ),
        max_size=6,
    ),
    st.sampled_from(["steps", "seconds"]),
    st.sampled_from(["repeat_first", "drop"]),
    st.sampled_from(["wait", "drop_oldest"]),
)


@given(contracts)
def test_wire_round_trip(d: dict[str, Any]) -> None:
    obs = Observations.from_wire(d)
    wire = obs.to_wire()
    assert msgpack.unpackb(msgpack.packb(wire)) == wire
    assert Observations.from_wire(msgpack.unpackb(msgpack.packb(wire))) == obs
    assert differences(obs, Observations.from_wire(wire)) == []


def test_actions_round_trip() -> None:
    a = Actions(key="actions", hz=15.0, open_loop_horizon=10)
    assert Actions.from_wire(msgpack.unpackb(msgpack.packb(a.to_wire()))) == a
    assert Actions().to_wire() == {}


# ---- differences ------------------------------------------------------------------------


def test_differences_lines() -> None:
    config = Observations.from_wire(
        {
            "pad": "drop",
            "streams": {
                "top": {"at": [-15, 0]},
                "wrist": {},
                "j": {"every": 2, "camera": {"quality": 80}},
            },
        }
    )
    worker = Observations.from_wire(
        {"streams": {"top": {"at": [-10, 0]}, "j": {"every": 3}, "extra": {}}}
    )
    assert differences(config, worker) == [
        "pad: config 'drop', worker 'repeat_first'",
        "streams['extra']: declared by worker, not by config",
        "streams['j'].every: config 2, worker 3",
        "streams['j'].camera: config {'resize': 'stretch', 'filter': 'area', 'quality': 80, "
        "'layout': 'hwc_uint8'}, worker none",
        "streams['top'].at: config [-15, 0], worker [-10, 0]",
        "streams['wrist']: declared by config, not by worker",
    ]
    assert differences(config, config) == []
    named = differences(config, worker, a_name="a", b_name="b")
    assert named[0] == "pad: a 'drop', b 'repeat_first'"
