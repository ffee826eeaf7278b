"""``robotd trace show EPISODE.mcap``: an episode's timeline, readable or as JSON.

By default runs of ticks in the same state (moving, held, a shield intervention, an
invalid observation, skipped) and runs of one camera's frames are folded into one line;
``--all`` prints every record. ``--json`` prints one JSON object (frames without their
image bytes). Control characters in what a record holds are printed as escapes (``\\x1b``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from robotd.operator.words import printable
from robotd.trace.codec import strict_json
from robotd.trace.reader import TraceError, TraceMessage, TraceReader
from robotd.trace.schemas import START_STATE, TICK, is_camera_topic


def _tick_state(r: dict[str, Any]) -> str:
    if r.get("skipped"):
        return "skipped"
    if not r.get("ok", True):
        return "observation invalid"
    parts = ["held" if r.get("held") else "moving"]
    if r.get("shield"):
        parts.append(f"shield {r['shield']}")
    return ", ".join(parts)


def _nums(values: Any) -> str:
    if not isinstance(values, list):
        return str(values)
    return "[" + " ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in values) + "]"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> Any:
    return len(value) if isinstance(value, list) else value


def _sanitized(places: Any) -> str:
    """The mark of an operator record whose arguments were not JSON as sent: the args shown
    are not what the client sent there (robotd.trace.sanitize), so say where."""
    if not places:
        return ""
    if isinstance(places, list):
        return f" (sanitized: {', '.join(str(p) for p in places)})"
    return f" (sanitized: {json.dumps(places)})"  # not the schema's list: shown as it is


def _one(msg: TraceMessage) -> str:
    r = msg.record
    if msg.topic == TICK:
        return (f"tick s={r.get('s')} wep={r.get('wep')} {_tick_state(r)} pos={_nums(r.get('pos'))}"
                f" target={_nums(r.get('target'))}")
    if is_camera_topic(msg.topic):
        return f"frame {msg.topic.rsplit('/', 1)[-1]} #{r.get('frame_index')}"
    if msg.topic == "/events":
        detail = " ".join(f"{k}={json.dumps(v)}" for k, v in _dict(r.get("detail")).items())
        return f"{r.get('name')} tick={r.get('tick')} {detail}".rstrip()
    if msg.topic == "/policy/chunk":
        rows = _count(r.get("rows"))
        return (f"chunk ask={r.get('ask')} from={r.get('from')} at={r.get('at')} rows={rows}"
                f" dropped={r.get('dropped')}" + (" STALE" if r.get("stale") else ""))
    if msg.topic == "/policy/ask":
        return (f"ask id={r.get('id')} s={r.get('s')} queue={r.get('queue')}"
                f" delay={r.get('delay')}")
    if msg.topic == "/operator":
        verdict = "ok" if r.get("ok") else f"error: {r.get('error')}"
        line = f"operator {r.get('cmd')} {json.dumps(r.get('args'))} -> {verdict}"
        return line + _sanitized(r.get("sanitized"))
    if msg.topic == "/link":
        return f"link {r.get('kind')} {json.dumps(r.get('detail'))}"
    if msg.topic == START_STATE:
        return (f"start state tick={r.get('tick')} wep={r.get('wep')} anchor={_nums(r.get('last'))}"
                f" asks so far={r.get('ask_id')} horizon={r.get('open_loop_horizon')}")
    return f"{msg.topic} {json.dumps(r)[:200]}"


class _Run:
    """A run of like records, held as its first, its last and a count: a folded line
    needs no more, and an episode can be one run of thousands of ticks and frames."""

    __slots__ = ("first", "last", "n")

    def __init__(self, msg: TraceMessage) -> None:
        self.first = self.last = msg
        self.n = 1

    def add(self, msg: TraceMessage) -> None:
        self.last = msg
        self.n += 1


def _fold(messages: Iterator[TraceMessage]) -> Iterator[tuple[int, str]]:
    """(log_time, line) with runs of same-state ticks folded, and each camera's frames
    folded beside them: frames never break a run of ticks (with trace.frames = "all" one
    comes before every tick), they are said as one line a camera when the run ends."""
    run: _Run | None = None
    frames: dict[str, _Run] = {}
    key = None

    def flush(end: bool = False) -> Iterator[tuple[int, str]]:
        nonlocal run
        if run is None and not end:  # frames before a run's first tick are that run's
            return
        if run is not None and run.n == 1:
            yield run.first.log_time, _one(run.first)
        elif run is not None:
            a, b = run.first.record, run.last.record
            yield run.first.log_time, (
                f"ticks s={a.get('s')}..{b.get('s')} ({run.n}) {_tick_state(a)}")
        for got in frames.values():
            if got.n == 1:
                yield got.first.log_time, _one(got.first)
            else:
                cam = got.first.topic.rsplit("/", 1)[-1]
                a, b = got.first.record, got.last.record
                yield got.first.log_time, (
                    f"frames {cam} #{a.get('frame_index')}..#{b.get('frame_index')} "
                    f"({got.n})")
        run = None
        frames.clear()

    for msg in messages:
        if is_camera_topic(msg.topic):
            if msg.topic in frames:
                frames[msg.topic].add(msg)
            else:
                frames[msg.topic] = _Run(msg)
            continue
        k = (TICK, _tick_state(msg.record), msg.record.get("wep")) if msg.topic == TICK else None
        if k is None or k != key:
            yield from flush()
            key = k
        if k is None:
            yield msg.log_time, _one(msg)
        elif run is None:
            run = _Run(msg)
        else:
            run.add(msg)
    yield from flush(end=True)


def _header(reader: TraceReader) -> list[str]:
    ep, end = _dict(reader.episode), _dict(reader.end)
    lines = [f"{reader.path}", reader.status.message]
    if ep.get("episode") is not None:
        lines.append(f"episode {ep.get('episode')} of run {ep.get('run')}, task {ep.get('task')!r},"
                     f" {ep.get('hz')} Hz, ticks every {ep.get('tick_every')}")
    elif ep:  # the run's session file: what came outside the episodes (commands, faults)
        lines.append(f"session of run {ep.get('run')}: what came outside the episodes")
    if end:
        lines.append(f"outcome {end.get('outcome')}, verdict {json.dumps(end.get('verdict'))},"
                     f" {end.get('ticks')} ticks, {end.get('duration_s')} s")
    return lines


def _json(reader: TraceReader) -> dict[str, Any]:
    timeline = []
    for msg in reader.messages():
        record = msg.record
        if is_camera_topic(msg.topic) and isinstance(record.get("data"), str):
            record = {**record, "data": None, "data_bytes": len(record["data"]) * 3 // 4}
        timeline.append({"t": msg.log_time, "topic": msg.topic, "seq": msg.sequence,
                         "record": record})
    st = reader.status
    return {
        "file": str(reader.path),
        "status": {"complete": st.complete, "torn": st.torn, "message": st.message,
                   "messages": st.messages, "bad_messages": st.bad_messages},
        "episode": reader.episode, "end": reader.end, "timeline": timeline,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="robotd trace show", description=__doc__.splitlines()[0])
    p.add_argument("episode", type=Path, help="an episode's .mcap file")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--all", action="store_true", help="every record, nothing folded")
    args = p.parse_args(argv)
    reader = TraceReader(args.episode)
    try:
        if args.json:
            print(strict_json(_json(reader)))  # NaN is no JSON: null, named in _nonfinite
            return 0
        messages = reader.messages()
        lines = ((m.log_time, _one(m)) for m in messages) if args.all else _fold(messages)
        body = list(lines)  # read first: the header states what the read found
    except TraceError as exc:
        print(f"robotd trace show: {exc}", file=sys.stderr)
        return 2
    # What a record holds is the writer's, not ours (a client's text in an error message, a
    # file from elsewhere): nothing in it may drive the terminal, so control characters are
    # shown as escapes.
    print("\n".join(printable(line) for line in _header(reader)))
    t0 = min((t for t, _ in body), default=0)
    for t, text in body:
        print(f"  {(t - t0) / 1e9:+10.3f}s  {printable(text)}")
    return 0
