"""Inference parameters: the keyword arguments of a policy's infer that have defaults.

    def infer(self, inputs, *, episode=None, temperature: float = 1.0, mode: str = "fast"):

declares `temperature` (float) and `mode` (str). A parameter's type comes from its
annotation (bool, int, float, str, `X | None`, or a `Literal[...]` of such values), else from
its default's type; one of no other type is not settable (left out, with a warning). The
worker lists them in hello; a `params` request sets them for the episodes that start after
it (never during one). Values from the wire are checked here: nothing unknown, nothing of
the wrong type, no NaN or infinity, strings of at most MAX_STR characters.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Any, Literal

MAX_PARAMS = 64  # names one request may set
MAX_NAME = 128
MAX_STR = 1024
_TYPES: dict[type, str] = {bool: "bool", int: "int", float: "float", str: "str"}
SKIPPED = ("self", "episode", "rtc")  # rtc: the act's frozen prefix, not a parameter


class ParamError(ValueError):
    """A value or name a `params` request may not set; the message names the field."""


@dataclass(frozen=True, slots=True)
class Param:
    """One declared parameter: `type` is bool | int | float | str; `nullable`: None is
    allowed too; `choices`: the only values allowed (a Literal), or None."""

    name: str
    type: str
    default: Any
    nullable: bool = False
    choices: tuple[Any, ...] | None = None

    def to_wire(self, value: Any) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "default": self.default,
            "nullable": self.nullable,
            "choices": list(self.choices) if self.choices is not None else None,
            "value": value,
        }

    def check(self, value: Any, where: str) -> Any:
        """`value` as this parameter takes it, or ParamError naming `where`."""
        if value is None:
            if self.nullable:
                return None
            raise ParamError(f"{where}: None is not allowed (type {self.type})")
        value = _of_type(self.type, value, where)
        if self.choices is not None and value not in self.choices:
            raise ParamError(f"{where}: {value!r} is not one of {list(self.choices)}")
        return value


def _of_type(kind: str, value: Any, where: str) -> Any:
    is_bool = isinstance(value, bool)
    if kind == "bool" and is_bool:
        return value
    if kind == "int" and isinstance(value, int) and not is_bool:
        return value
    if kind == "float" and isinstance(value, int | float) and not is_bool:
        if not math.isfinite(value):
            raise ParamError(f"{where}: {value!r} is not a finite number")
        return float(value)
    if kind == "str" and isinstance(value, str):
        if len(value) > MAX_STR:
            raise ParamError(f"{where}: a string of {len(value)} characters (at most {MAX_STR})")
        return value
    shown = repr(value)[:64]
    raise ParamError(f"{where}: {shown} ({type(value).__name__}) is not of type {kind}")


def declared_params(infer: Callable[..., Any]) -> tuple[dict[str, Param], list[str]]:
    """The parameters `infer` declares, and a warning for each keyword it leaves out."""
    try:
        signature = inspect.signature(infer)
    except (TypeError, ValueError):
        return {}, []
    try:
        hints = typing.get_type_hints(infer)
    except Exception:  # unresolvable annotations: fall back on the defaults' types
        hints = {}
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]
    inputs = positional[0].name if positional else None
    out: dict[str, Param] = {}
    warnings: list[str] = []
    for p in signature.parameters.values():
        if (
            p.name in SKIPPED
            or p.name == inputs
            or p.default is p.empty
            or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ):
            continue
        param = _param(p.name, hints.get(p.name), p.default)
        if isinstance(param, str):
            warnings.append(f"infer's keyword {p.name!r} is not settable: {param}")
        else:
            out[p.name] = param
    return out, warnings


def _param(name: str, hint: Any, default: Any) -> Param | str:
    """The Param, or why `name` cannot be one."""
    nullable, choices = False, None
    if hint is None:
        hint = type(default) if default is not None else None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, UnionType):
        args = [a for a in typing.get_args(hint) if a is not NoneType]
        nullable = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else None
        origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        kinds = {type(c) for c in choices}
        hint = kinds.pop() if len(kinds) == 1 else None
    kind = _TYPES.get(hint) if isinstance(hint, type) else None
    if kind is None:
        return "its type is not bool, int, float or str (annotate it)"
    param = Param(name, kind, default, nullable, choices)
    try:
        param.check(default, "default")
    except ParamError as err:
        return f"its default does not fit its type ({err})"
    return param


def check_params(declared: Mapping[str, Param], given: Any, field: str = "set") -> dict[str, Any]:
    """The values of a `params` request's `field`, each checked; ParamError naming the first
    field at fault (and the known names for an unknown one). Nothing is partly applied."""
    if not isinstance(given, dict):
        raise ParamError(f"field {field!r}: not a map of parameter name -> value")
    if len(given) > MAX_PARAMS:
        raise ParamError(f"field {field!r}: {len(given)} names (at most {MAX_PARAMS})")
    out: dict[str, Any] = {}
    for name, value in given.items():
        shown = name[:MAX_NAME] if isinstance(name, str) else repr(name)[:MAX_NAME]
        param = declared.get(name) if isinstance(name, str) else None
        if param is None:
            known = ", ".join(sorted(declared)) or "none: infer declares no parameters"
            raise ParamError(f"field '{field}.{shown}': unknown parameter (known: {known})")
        out[name] = param.check(value, f"field '{field}.{name}'")
    return out


def params_to_wire(declared: Mapping[str, Param], values: Mapping[str, Any]) -> list[dict]:
    """What hello lists: each parameter with the value the next episode will use."""
    return [p.to_wire(values.get(name, p.default)) for name, p in declared.items()]


def param_from_wire(item: Any) -> Param:
    """A Param as a copy of the policy declared it (Param.to_wire); ParamError if malformed."""
    if not isinstance(item, dict):
        raise ParamError(f"parameter declaration is not a map ({type(item).__name__})")
    name, kind, choices = item.get("name"), item.get("type"), item.get("choices")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or kind not in _TYPES.values():
        raise ParamError(f"parameter declaration {str(item)[:100]}: bad name or type")
    if choices is not None and not isinstance(choices, list):
        raise ParamError(f"parameter {name!r}: choices not a list")
    param = Param(
        name,
        kind,
        item.get("default"),
        item.get("nullable") is True,
        tuple(choices) if choices is not None else None,
    )
    param.check(param.default, f"parameter {name!r}: default")
    return param
