"""The observation and action contracts a policy declares (what a policy reads and answers).

A policy says what it reads (`Observations`) and how its answer is shaped (`Actions`). The
worker sends both at connect (`to_wire` / `from_wire`); a config file may declare them for
servers that cannot. Every model is immutable and valid by construction: a bad contract
raises `ContractError`, whose message names the key path and the rule broken, e.g.

    observations.streams['top'].at: offset 3 > 0 (offsets must be <= 0)

Keyword construction validates too. A `Stream`'s schedule rules (offsets <= 0, each once,
at most 256; `at` or `every`; `every` > 0) and the rules that need the unit (whole steps)
are checked by the `Observations` holding it, which knows every key: a Stream is built
before the dict naming it, so `Stream(at=[5, 0])` on its own checks only its fields' types
(`stream.at: Input should be a valid list ...`). A `Camera` checks its own rules
(`camera.quality: ...`): one camera spec is often shared by several streams. `resolve(hz)`
turns a contract into integer step offsets for the planner. The rules an answer is held to
are in `robotd.contract.answers`.
"""

from robotd.contract.answers import MAX_ANSWER_BYTES, MAX_ANSWER_COLUMNS, MAX_ANSWER_ROWS
from robotd.contract.diff import differences
from robotd.contract.models import Actions, Camera, Observations, Stream
from robotd.contract.resolved import ResolvedObservations, ResolvedStream
from robotd.contract.rules import (
    MAX_IMAGE_PIXELS,
    MAX_IMAGE_SIDE,
    MAX_RTC_DIM,
    MAX_RTC_ROWS,
    MAX_STEPS,
    MAX_STREAMS,
    MAX_WINDOW,
    ContractError,
)

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_ANSWER_COLUMNS",
    "MAX_ANSWER_ROWS",
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_SIDE",
    "MAX_RTC_DIM",
    "MAX_RTC_ROWS",
    "MAX_STEPS",
    "MAX_STREAMS",
    "MAX_WINDOW",
    "Actions",
    "Camera",
    "ContractError",
    "Observations",
    "ResolvedObservations",
    "ResolvedStream",
    "Stream",
    "differences",
]
