"""What every config section is built of: the base model and the field types they share.

The base model's rules hold for every section and for the whole Config (robotd.config.model):
no unknown key, frozen, every float finite. The field types and checks are those more than
one section needs: finite floats and safety limits, a name used as a key, no duplicate in
a list of names, a driver name that names a driver.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

PositiveFloat = Annotated[float, Field(gt=0)]
# A safety limit: NaN would make every comparison false (and the shield's clamp emit NaN),
# inf no limit at all, zero or less a robot that cannot move.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
SafetyLimit = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class ConfigModel(BaseModel):
    # every float finite: NaN fails every bound silently, infinity overflows what is derived
    # from it (the loader also names both itself: config.overrides). The loader validates
    # strictly (a TOML bool is no number, a string no bool; an int is taken for a float), so
    # a field's type must be one TOML spells directly: no tuple, Path or Enum, which strict
    # validation refuses from a TOML array or string (tests/test_config_strict.py checks).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _name(value: str) -> str:
    """A name used as a key (a joint's, in observations, traces and exports): not empty and
    not only blanks, which no reader of those keys can tell apart or see."""
    if not value.strip():
        raise ValueError(f"a name must not be empty or only blanks, got {value!r}")
    return value


Name = Annotated[str, AfterValidator(_name)]


def no_duplicates(kind: str, names: list[str]) -> list[str]:
    """`names` unchanged; ValueError naming the first name given twice and both places."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise ValueError(f"duplicate {kind} {name!r} (at [{seen[name]}] and [{i}])")
        seen[name] = i
    return names


def known_driver(kind: str, name: Any) -> Any:
    """A driver name that names a driver (a built-in or a plugin's entry point), checked
    with its section so that a typo is reported as such, before the rules that span
    sections (robot.start's 'simulated robots only')."""
    from drivers.base import DriverConfigError, driver_class

    if isinstance(name, str):
        try:
            driver_class(kind, name)
        except DriverConfigError as exc:
            raise ValueError(str(exc)) from None
    return name
