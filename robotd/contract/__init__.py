"""The observation and action contracts a policy declares (what a policy reads and answers).

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

from robotd.contract.diff import differences
from robotd.contract.models import Actions, Camera, Observations, Stream
from robotd.contract.resolved import ResolvedObservations, ResolvedStream
from robotd.contract.rules import (
    MAX_IMAGE_SIDE,
    MAX_RTC_DIM,
    MAX_RTC_ROWS,
    MAX_STEPS,
    MAX_STREAMS,
    MAX_WINDOW,
    ContractError,
)

__all__ = [
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
