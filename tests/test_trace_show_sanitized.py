"""`robotd trace show` marks an operator record whose arguments could not be recorded as
sent (written printable by the recorder, `sanitized` saying where), in its lines and its
JSON, and leaves a plain record unmarked. The traces are written by the daemon's own
recorder into a real trace store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robotd.cli import main as robotd_main
from robotd.lane.messages import Event, StartState
from robotd.runtime.recorder import Recorder
from robotd.trace.store import TraceStore

CONFIG = {"control": {"hz": 30.0}, "joints": {"names": ["a", "b", "c"]}}
HOSTILE = {"set": {b"key": 1, "ok": b"\x00\x1b[2J"}}  # a bytes key, a bytes value
MARK = "(sanitized: /set/ok, /set/bytes:6b6579)"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run whose session holds a hostile and a plain `params set`, and whose episode holds
    a hostile one too."""
    store = TraceStore(tmp_path / "runs", 1 << 30, CONFIG)
    rec = Recorder(store, clock=lambda: 5_000, wall_offset_ns=10**18)
    rec.operator("params", HOSTILE, "bad_params: no such params")
    rec.operator("params", {"set": {"gain": 2.0}}, None)
    rec.feed(StartState(1, "r-1", "r", 1, 9, [0.0] * 3, [0.0] * 3, 0, 0, 0, 8, True, True,
                        0, 0, "pick"))
    rec.feed(Event("episode_start", 9, {"episode": 1, "wep": "r-1"}))
    rec.operator("params", {"set": {"gain": b"\xff"}}, "bad_params: gain: not a number")
    rec.feed(Event("episode_end", 20, {"episode": 1, "wep": "r-1", "outcome": "stopped"}))
    store.close()
    assert store.run_dir is not None
    return store.run_dir


def _show(capsys: pytest.CaptureFixture[str], path: Path, *flags: str) -> str:
    assert robotd_main(["trace", "show", str(path), *flags]) == 0
    return capsys.readouterr().out


def _operator_lines(text: str) -> list[str]:
    return [line.split("s  ", 1)[1] for line in text.splitlines() if "s  operator " in line]


@pytest.mark.parametrize("flags", [(), ("--all",)])
def test_a_sanitized_record_is_marked_where_and_a_plain_one_is_not(run, capsys, flags):
    lines = _operator_lines(_show(capsys, run / "session.mcap", *flags))
    assert lines == [
        'operator params {"set": {"ok": {"bytes": "001b5b324a"}, "bytes:6b6579": 1}} -> '
        f"error: bad_params: no such params {MARK}",
        'operator params {"set": {"gain": 2.0}} -> ok',
    ]


def test_an_episodes_sanitized_record_is_marked_too(run, capsys):
    (line,) = _operator_lines(_show(capsys, run / "episode-000001.mcap"))
    assert line.endswith("-> error: bad_params: gain: not a number (sanitized: /set/gain)")


def test_the_json_keeps_where_it_was_sanitized(run, capsys):
    doc = json.loads(_show(capsys, run / "session.mcap", "--json"))
    ops = [m["record"] for m in doc["timeline"] if m["topic"] == "/operator"]
    assert [o.get("sanitized") for o in ops] == [["/set/ok", "/set/bytes:6b6579"], None]
    assert ops[0]["args"] == {"set": {"ok": {"bytes": "001b5b324a"}, "bytes:6b6579": 1}}


def test_show_json_is_strict_json_when_a_record_held_nan(tmp_path, capsys):
    # a NaN in params set is recorded null + _nonfinite; show --json reads it back as NaN,
    # which is no JSON: it must print null and name it, as the trace does
    store = TraceStore(tmp_path / "runs", 1 << 30, CONFIG)
    rec = Recorder(store, clock=lambda: 5_000, wall_offset_ns=10**18)
    rec.operator("params", {"set": {"gain": float("nan"), "k": float("-inf")}}, None)
    store.close()
    assert store.run_dir is not None
    text = _show(capsys, store.run_dir / "session.mcap", "--json")
    def refuse(word: str) -> None:
        raise ValueError(f"not JSON: {word}")
    shown = json.loads(text, parse_constant=refuse)  # NaN, Infinity: refused
    found = shown["_nonfinite"]
    assert sorted(found.values()) == ["-inf", "nan"], found
