"""An episode's trace read back as what a replay needs: the config, the kernel's start
state, every tick record, the chunks that arrived and the inputs that came between ticks.

Everything in the file is checked as it is read (a trace is a file, so hostile): a record
of the wrong shape is a `ReplayError` naming the record and the field, never a crash. A
trace that cannot be replayed exactly is refused with the reason: ticks decimated
(``trace.ticks``), records lost (a queue drop, a damaged chunk), no start state, no config.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from pydantic import ValidationError

from robotd.config import Config
from robotd.errors import format_validation_error
from robotd.lane.messages import StartState
from robotd.trace.reader import TraceError, TraceReader
from robotd.trace.rundir import RUN_JSON, read_json
from robotd.trace.schemas import ASK, CHUNK, EPISODE_END, EVENTS, START_STATE, TICK, TRACE_DROP

# Lane events that are inputs to the kernel between two ticks (applied in recorded order).
INPUTS = frozenset({"act_failed", "episode_reset", "contract"})
LOST = frozenset({TRACE_DROP, "lane_drop"})  # records lost on the way: no exact replay


class ReplayError(ValueError):
    """A trace that cannot be replayed; the message says which file and why."""


@dataclass(frozen=True)
class TickRecord:
    """One recorded /robot/tick: a step made (or skipped) at kernel tick `tick`."""

    tick: int
    wep: str
    s: int
    t_ns: int
    pos: np.ndarray
    vel: np.ndarray
    cams: dict[str, tuple[int, int] | None]
    target: list[float] | None
    held: bool
    shield: str
    ok: bool
    skipped: bool


@dataclass(frozen=True)
class ChunkRecord:
    ask: int
    wep: str
    from_step: int
    result: str  # merged | stale | bad | discarded
    at: int | None
    dropped: int
    tick: int | None  # bad or discarded: the tick that said so
    rows: np.ndarray


@dataclass
class Recorded:
    """An episode's trace, ready to replay."""

    path: Path
    config: Config
    start: StartState
    ticks: list[TickRecord] = field(default_factory=list)
    asks: list[dict[str, Any]] = field(default_factory=list)
    chunks: dict[int, ChunkRecord] = field(default_factory=dict)
    inputs: dict[int, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    end: dict[str, Any] | None = None  # {"tick", "outcome", "cause"} as the lane said
    notes: list[str] = field(default_factory=list)


def _int(r: dict[str, Any], key: str, where: str, *, null: bool = False) -> Any:
    v = r.get(key)
    if v is None and null:
        return None
    if type(v) is not int:
        raise ReplayError(f"{where}: field {key!r} is not an integer ({v!r:.60})")
    return v


def _vec(value: Any, dim: int, what: str, where: str) -> list[float]:
    ok = isinstance(value, list) and len(value) == dim and all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in value)
    if not ok:
        raise ReplayError(f"{where}: {what} is not a list of {dim} numbers ({value!r:.80})")
    return [float(x) for x in value]


def _cams(value: Any, where: str) -> dict[str, tuple[int, int] | None]:
    if not isinstance(value, dict) or len(value) > 64:
        raise ReplayError(f"{where}: field 'cams' is not a map of cameras")
    out: dict[str, tuple[int, int] | None] = {}
    for name, ref in value.items():
        if ref is None:
            out[name] = None
        elif isinstance(ref, list) and len(ref) == 2 and all(type(x) is int for x in ref):
            out[name] = (ref[0], ref[1])
        else:
            raise ReplayError(f"{where}: cams[{name!r}] is not [frame index, time] ({ref!r:.60})")
    return out


def tick_record(r: dict[str, Any], dim: int, where: str) -> TickRecord:
    target = r.get("target")
    shield = r.get("shield")
    if shield not in ("", "clipped", "clamped", "rejected"):
        raise ReplayError(f"{where}: field 'shield' is {shield!r}")
    return TickRecord(
        tick=_int(r, "tick", where), wep=str(r.get("wep", ""))[:256], s=_int(r, "s", where),
        t_ns=_int(r, "t_ns", where),
        pos=np.asarray(_vec(r.get("pos"), dim, "pos", where), dtype=np.float64),
        vel=np.asarray(_vec(r.get("vel"), dim, "vel", where), dtype=np.float64),
        cams=_cams(r.get("cams"), where),
        target=None if target is None else _vec(target, dim, "target", where),
        held=r.get("held") is True, shield=shield, ok=r.get("ok") is True,
        skipped=r.get("skipped") is True,
    )


def chunk_record(r: dict[str, Any], where: str) -> ChunkRecord:
    rows = r.get("rows")
    result = r.get("result")
    if result not in ("merged", "stale", "bad", "discarded"):
        raise ReplayError(f"{where}: field 'result' is {result!r}")
    try:
        array = np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError):
        raise ReplayError(f"{where}: field 'rows' is not rows of numbers") from None
    if array.ndim != 2 or array.shape[0] < 1 or array.size > 1 << 20:
        raise ReplayError(f"{where}: field 'rows' of shape {list(array.shape)} (the rows sent "
                          "down were not recorded)")
    return ChunkRecord(
        ask=_int(r, "ask", where), wep=str(r.get("wep", ""))[:256],
        from_step=_int(r, "from", where), result=result, at=_int(r, "at", where, null=True),
        dropped=_int(r, "dropped", where), tick=_int(r, "tick", where, null=True), rows=array,
    )


def _config(path: Path) -> Config:
    run = read_json(path.parent / RUN_JSON)
    if not isinstance(run, dict) or not isinstance(run.get("config"), dict):
        raise ReplayError(f"{path}: no config snapshot beside it ({path.parent / RUN_JSON}): "
                          "a replay needs the run directory the episode was recorded in")
    try:
        return Config.model_validate(run["config"])
    except ValidationError as exc:
        raise ReplayError(format_validation_error(exc, str(path.parent / RUN_JSON))) from None


def _start(record: dict[str, Any], where: str) -> StartState:
    try:
        return msgspec.convert(record, StartState)
    except msgspec.ValidationError as exc:
        raise ReplayError(f"{where}: {exc}") from None


def load(path: Path | str) -> Recorded:
    """Read `path` for a replay; ReplayError saying why it cannot be replayed."""
    path = Path(path)
    reader = TraceReader(path)
    try:
        messages = list(reader.messages())
    except TraceError as exc:
        raise ReplayError(str(exc)) from None
    if not reader.episode:
        raise ReplayError(f"{path}: no episode metadata: the file holds nothing of an episode "
                          f"({reader.status.message or 'no episode was recorded in it'})")
    every = reader.episode.get("tick_every")
    if every != 1:
        raise ReplayError(
            f"{path}: the trace keeps one tick in {every} (trace.ticks = {every}); a replay "
            "needs every tick: record with trace.ticks = \"all\"")
    if reader.status.gaps:
        raise ReplayError(f"{path}: records are missing ({reader.status.first_gap}): "
                          "a replay needs every record")
    cfg = _config(path)
    starts = [m for m in messages if m.topic == START_STATE]
    if not starts:
        raise ReplayError(f"{path}: no start state (/robot/start_state): the kernel's state at "
                          "the episode's start was not recorded")
    rec = Recorded(path, cfg, _start(starts[0].record, f"{path}: {START_STATE}"))
    if not reader.status.complete:
        rec.notes.append(reader.status.message)
    _fill(rec, messages, len(cfg.joints.names))
    return rec


def _fill(rec: Recorded, messages: Iterable[Any], dim: int) -> None:
    for i, m in enumerate(messages):
        where, r = f"{rec.path.name}: record {i} ({m.topic})", m.record
        if m.topic == TICK:
            rec.ticks.append(tick_record(r, dim, where))
        elif m.topic == ASK:
            rec.asks.append({k: _int(r, k, where) for k in ("id", "s", "queue")}
                            | {"wep": str(r.get("wep", "")), "delay": r.get("delay", 0),
                               "frozen": r.get("frozen", 0)})
        elif m.topic == CHUNK:
            c = chunk_record(r, where)
            if c.result != "discarded":  # nothing of a discarded chunk reaches the queue
                rec.chunks[c.ask] = c
        elif m.topic == EVENTS:
            _event(rec, r, where)


def _event(rec: Recorded, r: dict[str, Any], where: str) -> None:
    name, detail = r.get("name"), r.get("detail")
    if not isinstance(detail, dict):
        raise ReplayError(f"{where}: field 'detail' is not a map")
    # frames alone lost (a writer queue full of pictures) take nothing from the kernel's inputs
    frames_only = name == TRACE_DROP and detail.get("records") == 0
    if name in LOST and not frames_only:
        raise ReplayError(f"{rec.path}: {name}: records were dropped on the way to the trace "
                          f"({detail}); a replay needs every record")
    if name in INPUTS:
        tick = _int(r, "tick", where)
        rec.inputs.setdefault(tick, []).append((name, detail))
    elif name == EPISODE_END and r.get("tick") is not None:
        rec.end = {"tick": _int(r, "tick", where), "outcome": str(detail.get("outcome", "")),
                   "cause": str(detail.get("cause") or "")}


def same_bits(a: list[float] | None, b: list[float] | None) -> bool:
    """Equal float64 for float64 (NaN equal to NaN, -0.0 apart from 0.0)."""
    if a is None or b is None:
        return a is None and b is None
    return len(a) == len(b) and all(
        (x == y and math.copysign(1.0, x) == math.copysign(1.0, y)) or (x != x and y != y)
        for x, y in zip(a, b))
