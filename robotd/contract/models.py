"""The contract's models: Camera, Stream, Observations (what a policy reads) and Actions
(how its answer is shaped). Immutable and valid by construction."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from robotd.contract.answers import MAX_ANSWER_ROWS
from robotd.contract.resolved import ResolvedObservations, ResolvedStream, _to_steps
from robotd.contract.rules import (
    MAX_IMAGE_PIXELS,
    MAX_IMAGE_SIDE,
    MAX_STEPS,
    MAX_STREAMS,
    ContractError,
    Loc,
    _convert,
    _num,
    _Rules,
    _whole_steps,
    _window_problems,
)


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
        if not problems and self.width is not None and self.height is not None:
            area = self.width * self.height
            if area > MAX_IMAGE_PIXELS:
                problems.append(((), f"{self.width}x{self.height} is {area} pixels, over "
                                 f"{MAX_IMAGE_PIXELS} (8192x4096)"))  # fmt: skip
        if not 1 <= self.quality <= 100:
            problems.append((("quality",), f"{self.quality} out of range (must be 1..100)"))
        if problems:
            raise _Rules(problems)
        return self


class Stream(_Model):
    """One observation key's schedule: `at` offsets (<= 0, each once), or `every` k, or
    neither (the act's own step alone). Values are in the contract's unit.

    Construction checks the fields' types (`stream.at: Input should be a valid list`); the
    schedule's rules (`rule_problems`) are checked by the Observations holding it, so that
    their errors name its key (`observations.streams['top'].at: offset 5 > 0`): a Stream
    is built before the dict that names it, and does not know its key."""

    _where: ClassVar[str] = "stream"
    at: list[float] | None = None
    every: float | None = None
    camera: Camera | None = None

    @field_validator("at", mode="before")
    @classmethod
    def _tuple_ok(cls, v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v

    def rule_problems(self) -> list[tuple[Loc, str]]:
        """The schedule rules this stream breaks: (path below the stream, rule) pairs."""
        problems: list[tuple[Loc, str]] = []
        if self.at is not None and self.every is not None:
            problems.append(((), "at and every both set (a stream has one schedule)"))
        if self.every is not None and self.every <= 0:
            problems.append((("every",), f"every {_num(self.every)} must be > 0"))
        if self.at is not None:
            problems += [(("at",), msg) for msg in _window_problems(self.at)]
        return problems


class Observations(_Model):
    """What a policy reads: which keys, at which steps (docs/contract.md).

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
        for key, stream in self.streams.items():
            if not key.strip():
                problems.append((("streams", key), "empty key (a stream needs a name)"))
            problems += [(("streams", key, *loc), rule) for loc, rule in stream.rule_problems()]
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
    """How a policy's answer is shaped and played (docs/contract.md).

    key: the answer's field holding the rows (None: the answer itself). hz: the rate rows
    play at (> 0; None: the control rate). open_loop_horizon: at most this many rows play
    before the next act in sync mode (1..MAX_ANSWER_ROWS; None: the whole chunk). rtc: the
    policy takes real-time chunking's frozen prefix (`infer(..., rtc=...)`); None: as its
    infer's signature says (a keyword named `rtc`).
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
        n = self.open_loop_horizon
        if n is not None and not 1 <= n <= MAX_ANSWER_ROWS:
            # more rows than any chunk may hold says nothing a chunk's end does not: a typo,
            # or a worker's nonsense carried on to the control lane
            rule = (
                "must be >= 1"
                if n < 1
                else f"is over {MAX_ANSWER_ROWS}, the most rows a chunk may have"
            )
            problems.append((("open_loop_horizon",), f"open_loop_horizon {n} {rule}"))
        if problems:
            raise _Rules(problems)
        return self

    @classmethod
    def from_wire(cls, d: Any, where: str = "actions") -> Actions:
        return super().from_wire(d, where)
