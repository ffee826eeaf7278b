"""Driver options validated strictly where TOML can be: a bool is no number and a string
no bool, as in the config's own sections (which the loader validates with pydantic's
strict mode throughout).

Every driver's Options model is strict by its base (drivers.base.DriverOptions), and the
built-in ones refuse another kind in their unions too (opencv's `source = true`). A plugin's
model may have opted out (`strict=False`: it holds a type strict mode refuses from any TOML
value, a tuple from an array, a Path or an Enum from a string). So the options are
validated as the driver will validate them (its model's own mode), and strictly as well,
and of the strict-only errors only the wrong kinds of scalar are kept: what a lax model
would have coerced ("no" to False, true to 1, 2.5 refused but 2.0 taken as 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

M = TypeVar("M", bound=BaseModel)

WRONG_KIND = frozenset({"bool_type", "int_type", "float_type"})


def validate_strictly(
    model: type[M], data: Mapping[str, Any]
) -> tuple[M | None, list[ErrorDetails]]:
    """(the validated model, or None; every error: lax validation's, then each value of
    the wrong kind that it took)."""
    try:
        validated: M | None = model.model_validate(dict(data))
        errors: list[ErrorDetails] = []
    except ValidationError as exc:
        validated, errors = None, exc.errors()
    if model.model_config.get("strict"):
        return validated, errors  # the model's own validation was the strict one
    try:
        model.model_validate(dict(data), strict=True)
    except ValidationError as exc:
        taken = {tuple(e["loc"]) for e in errors}
        errors += [e for e in exc.errors() if _wrong_kind(model, e, taken)]
    return (validated if not errors else None), errors


def _wrong_kind(model: type[BaseModel], err: ErrorDetails, taken: set[tuple[Any, ...]]) -> bool:
    """A scalar of the wrong kind at a field or an item of a list field. Not a member of a
    union: its location names the member's type, and lax validation may rightly have taken
    the value as another member."""
    loc = tuple(err["loc"])
    return (
        err["type"] in WRONG_KIND
        and loc not in taken
        and bool(loc)
        and loc[0] in model.model_fields
        and all(isinstance(part, int) for part in loc[1:])
    )
