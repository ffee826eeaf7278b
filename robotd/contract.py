"""The observation and action contracts a policy declares (SPEC §2, §3).

A policy says what it reads (`Observations`) and how its answer is shaped (`Actions`). The
worker sends both at connect (`to_wire` / `from_wire`); a config file may declare them for
servers that cannot. Every model is immutable and valid by construction: a bad contract
raises `ContractError`, whose message names the key path and the rule broken, e.g.

    observations.streams['top'].at: offset 3 > 0 (offsets must be <= 0)

Keyword construction validates too; a `Stream` or `Camera` built on its own (outside an
`Observations` given as plain dicts) names itself (`stream.at: ...`), as its key is not
known yet. Rules that need the unit (whole steps) are checked by `Observations`, which
knows every key. `resolve(hz)` turns a contract into integer step offsets for the planner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

MAX_STREAMS = 64
MAX_WINDOW = 256
MAX_IMAGE_SIDE = 16384
MAX_STEPS = 10_000_000  # |offset| or every, in steps, after resolving
_MAX_SHOWN = 5

Loc = tuple[str | int, ...]


class ContractError(ValueError):
    """A contract broke a rule. `problems` holds one line per rule broken."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        shown = "; ".join(self.problems[:_MAX_SHOWN])
        more = len(self.problems) - _MAX_SHOWN
        super().__init__(shown + (f" (+{more} more)" if more > 0 else ""))


class _Rules(ValueError):
    """Raised inside validators; carries (loc below the validated model, rule) pairs."""

    def __init__(self, problems: list[tuple[Loc, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(msg for _, msg in problems))


def _num(x: float) -> str:
    """-15.0 -> '-15', -1.5 -> '-1.5': contracts read better without trailing .0."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def _path(where: str, loc: Loc, keyed_root: bool) -> str:
    """("streams", "top", "at", 1) -> "observations.streams['top'].at[1]"."""
    out = where
    for i, part in enumerate(loc):
        if part == "[key]":
            out += " (the key itself)"
        elif isinstance(part, int):
            out += f"[{part}]"
        elif keyed_root and i == 1 and loc[0] == "streams":
            out += f"[{part!r}]"
        else:
            out += f".{part}"
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _convert(err: ValidationError, where: str, keyed_root: bool) -> ContractError:
    """Turn pydantic's ValidationError into a ContractError naming each key path."""
    lines: list[str] = []
    for e in err.errors():
        loc = tuple(e["loc"])
        at = _path(where, loc, keyed_root)
        cause = e.get("ctx", {}).get("error")
        if isinstance(cause, _Rules):
            lines += [f"{_path(where, loc + sub, keyed_root)}: {m}" for sub, m in cause.problems]
        elif e["type"] == "value_error" and cause is not None:
            lines.append(f"{at}: {cause}")
        elif e["type"] == "extra_forbidden":
            lines.append(f"{at}: unknown field (extra fields not allowed)")
        else:
            lines.append(f"{at}: {e['msg']} (got {_short(e['input'])})")
    return ContractError(lines)


class _Model(BaseModel):
    """Immutable, strict (no bool-as-number, no str-to-number), no unknown fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    _where: ClassVar[str] = "contract"
    _keyed: ClassVar[bool] = False  # True where loc[1] under "streams" is a dict key

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise _convert(err, self._where, self._keyed) from None

    # Marks this __init__ as pydantic's own (RootModel does the same), so that nested models
    # and model_validate go through the core validator, not through this conversion: the
    # key path is then built once, from the outermost model.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def from_wire(cls, d: Any, where: str | None = None) -> Any:
        """Validate a plain dict (msgpack / JSON / config); raise ContractError naming `where`."""
        where = where or cls._where
        if not isinstance(d, Mapping):
            raise ContractError(f"{where}: expected a mapping, got {type(d).__name__}")
        try:
            return cls.model_validate(dict(d))
        except ValidationError as err:
            raise _convert(err, where, cls._keyed) from None

    def to_wire(self) -> dict[str, Any]:
        """Plain dict of builtins (msgpack-able); unset optional fields are left out."""
        return self.model_dump(mode="python", exclude_none=True)


class Camera(_Model):
    """How a camera frame is fitted robot-side, sent, and handed to the policy.

    width/height: target size, both or neither (neither: as captured). resize: stretch,
    crop (centre) or pad (letterbox). codec: jpeg | png | raw, None = as captured.
    quality: JPEG quality 1..100. layout: hwc_uint8, or chw_float (CHW float32 in 0..1).
    """

    _where: ClassVar[str] = "camera"
    width: int | None = None
    height: int | None = None
    resize: Literal["stretch", "crop", "pad"] = "stretch"
    filter: Literal["area", "linear", "cubic"] = "area"
    codec: Literal["jpeg", "png", "raw"] | None = None
    quality: int = 90
    layout: Literal["hwc_uint8", "chw_float"] = "hwc_uint8"

    @model_validator(mode="after")
    def _check(self) -> Camera:
        problems: list[tuple[Loc, str]] = []
        if (self.width is None) != (self.height is None):
            problems.append(((), "width and height go together (give both or neither)"))
        for name in ("width", "height"):
            side = getattr(self, name)
            if side is not None and not 0 < side <= MAX_IMAGE_SIDE:
                problems.append(((name,), f"{side} out of range (must be 1..{MAX_IMAGE_SIDE})"))
        if not 1 <= self.quality <= 100:
            problems.append((("quality",), f"{self.quality} out of range (must be 1..100)"))
        if problems:
            raise _Rules(problems)
        return self


class Stream(_Model):
    """One observation key's schedule: `at` offsets (<= 0, each once), or `every` k, or
    neither (the act's own step alone). Values are in the contract's unit."""

    _where: ClassVar[str] = "stream"
    at: list[float] | None = None
    every: float | None = None
    camera: Camera | None = None

    @field_validator("at", mode="before")
    @classmethod
    def _tuple_ok(cls, v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v

    @model_validator(mode="after")
    def _check(self) -> Stream:
        problems: list[tuple[Loc, str]] = []
        if self.at is not None and self.every is not None:
            problems.append(((), "at and every both set (a stream has one schedule)"))
        if self.every is not None and self.every <= 0:
            problems.append((("every",), f"every {_num(self.every)} must be > 0"))
        if self.at is not None:
            problems += [(("at",), msg) for msg in _window_problems(self.at)]
        if problems:
            raise _Rules(problems)
        return self


def _window_problems(at: list[float]) -> list[str]:
    if not at:
        return ["empty window (give at least one offset, e.g. [0])"]
    out: list[str] = []
    if len(at) > MAX_WINDOW:
        out.append(f"window of {len(at)} entries (at most {MAX_WINDOW})")
    out += [f"offset {_num(o)} > 0 (offsets must be <= 0)" for o in at if o > 0]
    seen: set[float] = set()
    for o in at:
        if o in seen:
            out.append(f"duplicate offset {_num(o)} (each offset once)")
        seen.add(o)
    return out


@dataclass(frozen=True)
class ResolvedStream:
    """A stream in whole steps: exactly one of `at` (ascending ints <= 0) or `every` (>= 1).
    A stream that declared neither resolves to at=(0,)."""

    at: tuple[int, ...] | None
    every: int | None


@dataclass(frozen=True)
class ResolvedObservations:
    """An `Observations` turned into steps at a control rate; what the window planner reads.

    `at` windows need not contain 0: the act's own step is in every window regardless
    (it may then read no key). `max_lookback` is the largest |offset| of the at-windows,
    i.e. how many past steps a robot-side ring must keep for them. Every-streams read the
    steps since the previous act, so their ring need is the act interval (horizon or
    latency), which only the caller knows and must add.
    """

    streams: Mapping[str, ResolvedStream]
    pad: Literal["repeat_first", "drop"]
    when_behind: Literal["wait", "drop_oldest"]
    hz: float

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(sorted(self.streams))

    @property
    def max_lookback(self) -> int:
        return max((-s.at[0] for s in self.streams.values() if s.at), default=0)


def _whole_steps(key: str, field: str, values: list[float]) -> list[tuple[Loc, str]]:
    label = "offset" if field == "at" else "every"
    return [
        (
            ("streams", key, field),
            f"{label} {_num(v)} is not a whole number of steps "
            "(unit is steps: values must be whole numbers)",
        )
        for v in values
        if not float(v).is_integer()
    ]


def _to_steps(seconds: float, hz: float) -> int:
    """Round to nearest, ties away from zero (so -0.05 s at 10 Hz is step -1)."""
    x = seconds * hz
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


class Observations(_Model):
    """What a policy reads (SPEC §2).

    streams: key -> Stream; only these keys are captured and sent. Empty: undeclared,
      the whole observation of the act's step alone.
    every: a default `every` for streams that declare neither `at` nor `every` (None: such
      streams read the act's own step alone).
    unit: "steps" (values must be whole numbers) or "seconds" (rounded to the nearest step
      at the control rate, see `resolve`).
    pad: a window step before step 0 reads step 0 (repeat_first) or is left out (drop).
    when_behind: uploads over the limit make the act wait, or drop the oldest frames.
    """

    _where: ClassVar[str] = "observations"
    _keyed: ClassVar[bool] = True
    streams: dict[str, Stream] = {}
    every: float | None = None
    unit: Literal["steps", "seconds"] = "steps"
    pad: Literal["repeat_first", "drop"] = "repeat_first"
    when_behind: Literal["wait", "drop_oldest"] = "wait"

    @model_validator(mode="after")
    def _check(self) -> Observations:
        problems: list[tuple[Loc, str]] = []
        if len(self.streams) > MAX_STREAMS:
            problems.append((("streams",), f"{len(self.streams)} streams (at most {MAX_STREAMS})"))
        for key in self.streams:
            if not key.strip():
                problems.append((("streams", key), "empty key (a stream needs a name)"))
        if self.every is not None and self.every <= 0:
            problems.append((("every",), f"every {_num(self.every)} must be > 0"))
        if self.unit == "steps":
            if self.every is not None and not float(self.every).is_integer():
                problems.append(
                    (
                        ("every",),
                        f"every {_num(self.every)} is not a whole number "
                        "of steps (unit is steps: values must be whole numbers)",
                    )
                )
            for key, s in self.streams.items():
                problems += _whole_steps(key, "at", s.at or [])
                problems += _whole_steps(key, "every", [] if s.every is None else [s.every])
        if problems:
            raise _Rules(problems)
        return self

    @classmethod
    def from_wire(cls, d: Any, where: str = "observations") -> Observations:
        return super().from_wire(d, where)

    def resolve(self, hz: float) -> ResolvedObservations:
        """Whole-step schedules at control rate `hz` (Hz). Seconds round to the nearest step
        (ties away from zero). Offsets that land on the same step, an `every` that rounds to
        0 steps, or a value beyond MAX_STEPS steps raise ContractError naming the stream."""
        if (
            isinstance(hz, bool)
            or not isinstance(hz, int | float)
            or not (math.isfinite(hz) and hz > 0)
        ):
            raise ContractError(f"observations.resolve: control rate hz={hz!r} must be > 0")
        problems: list[str] = []
        out: dict[str, ResolvedStream] = {}
        for key, s in self.streams.items():
            where = f"observations.streams[{key!r}]"
            every = s.every if s.every is not None else self.every
            if s.at is not None:
                out[key] = ResolvedStream(self._resolve_at(s.at, hz, where, problems), None)
            elif every is not None:
                where += ".every" if s.every is not None else " (default observations.every)"
                k = self._step(every, hz, where, problems)
                if k is not None and k < 1:
                    problems.append(
                        f"{where}: {_num(every)} s rounds to {k} steps at "
                        f"{_num(hz)} Hz (every must be >= 1 step)"
                    )
                out[key] = ResolvedStream(None, k or 1)
            else:
                out[key] = ResolvedStream((0,), None)
        if problems:
            raise ContractError(problems)
        return ResolvedObservations(out, self.pad, self.when_behind, float(hz))

    def _step(self, value: float, hz: float, where: str, problems: list[str]) -> int | None:
        """The value in whole steps, or None (and a problem noted) when out of range."""
        x = value if self.unit == "steps" else value * hz
        if not abs(x) <= MAX_STEPS:  # also catches inf from a huge seconds value
            given = _num(value) if self.unit == "steps" else f"{_num(value)} s at {_num(hz)} Hz"
            problems.append(f"{where}: {given} is beyond {MAX_STEPS} steps (too far to keep)")
            return None
        return int(x) if self.unit == "steps" else _to_steps(value, hz)

    def _resolve_at(
        self, at: list[float], hz: float, where: str, problems: list[str]
    ) -> tuple[int, ...]:
        by_step: dict[int, float] = {}
        for o in at:
            step = self._step(o, hz, f"{where}.at", problems)
            if step is None:
                continue
            if step in by_step:
                problems.append(
                    f"{where}.at: offsets {_num(by_step[step])} s and {_num(o)} s "
                    f"both round to step {step} at {_num(hz)} Hz "
                    "(each offset once)"
                )
            by_step[step] = o
        return tuple(sorted(by_step))


class Actions(_Model):
    """How a policy's answer is shaped (SPEC §3).

    key: the answer's field holding the rows (None: the answer itself). hz: the rate rows
    play at (> 0; None: the control rate). open_loop_horizon: at most this many rows play
    before the next act in sync mode (>= 1; None: the whole chunk). rtc: the policy takes
    real-time chunking's frozen prefix (`infer(..., rtc=...)`); None: as its infer's
    signature says (a keyword named `rtc`).
    """

    _where: ClassVar[str] = "actions"
    key: str | None = None
    hz: float | None = None
    open_loop_horizon: int | None = None
    rtc: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> Actions:
        problems: list[tuple[Loc, str]] = []
        if self.key is not None and not self.key.strip():
            problems.append((("key",), "empty key (give a field name, or leave it unset)"))
        if self.hz is not None and self.hz <= 0:
            problems.append((("hz",), f"hz {_num(self.hz)} must be > 0"))
        if self.open_loop_horizon is not None and self.open_loop_horizon < 1:
            problems.append(
                (("open_loop_horizon",), f"open_loop_horizon {self.open_loop_horizon} must be >= 1")
            )
        if problems:
            raise _Rules(problems)
        return self

    @classmethod
    def from_wire(cls, d: Any, where: str = "actions") -> Actions:
        return super().from_wire(d, where)


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_num(v) for v in value) + "]"
    if isinstance(value, float):
        return _num(value)
    return "unset" if value is None else repr(value)


def _camera_line(cam: Camera | None) -> str:
    return "none" if cam is None else repr(cam.to_wire())


def differences(
    a: Observations, b: Observations, *, a_name: str = "config", b_name: str = "worker"
) -> list[str]:
    """Human-readable lines, one per declared difference between two contracts (empty when
    they agree), for the warning when a config's contract differs from the worker's.
    Values are compared as declared (no resolving: no control rate is needed)."""
    lines: list[str] = []
    for field in ("unit", "pad", "when_behind", "every"):
        va, vb = getattr(a, field), getattr(b, field)
        if va != vb:
            lines.append(f"{field}: {a_name} {_fmt(va)}, {b_name} {_fmt(vb)}")
    for key in sorted(set(a.streams) | set(b.streams)):
        sa, sb = a.streams.get(key), b.streams.get(key)
        if sb is None:
            lines.append(f"streams[{key!r}]: declared by {a_name}, not by {b_name}")
        elif sa is None:
            lines.append(f"streams[{key!r}]: declared by {b_name}, not by {a_name}")
        else:
            for field in ("at", "every"):
                va, vb = getattr(sa, field), getattr(sb, field)
                if va != vb:
                    lines.append(
                        f"streams[{key!r}].{field}: {a_name} {_fmt(va)}, {b_name} {_fmt(vb)}"
                    )
            if sa.camera != sb.camera:
                lines.append(
                    f"streams[{key!r}].camera: {a_name} {_camera_line(sa.camera)}, "
                    f"{b_name} {_camera_line(sb.camera)}"
                )
    return lines
