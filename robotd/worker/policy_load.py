"""Loading a policy class by MODULE:CLASS and building it with its `--arg` values."""

from __future__ import annotations

import importlib
import inspect
import logging
import typing
from typing import Any

log = logging.getLogger(__name__)


class PolicyLoadError(ValueError):
    """The policy named on the command line cannot be loaded or built."""


def load_class(spec: str) -> type:
    """Import MODULE:CLASS (CLASS may be dotted, e.g. pkg.mod:Outer.Inner)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyLoadError(
            f"policy.serve {spec!r}: expected MODULE:CLASS, e.g. robotd.demo:DotFollower"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise PolicyLoadError(
            f"policy.serve {spec!r}: cannot import module {module_name!r}: {err}"
        ) from err
    except Exception as err:  # the module's own code failed (CUDA absent, a SyntaxError)
        log.debug("importing policy module %s failed", module_name, exc_info=True)
        text = " ".join(str(err).split())
        raise PolicyLoadError(
            f"policy.serve {spec!r}: importing module {module_name} raised "
            f"{type(err).__name__}" + (f": {text}" if text else "")
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PolicyLoadError(
                f"policy.serve {spec!r}: {module_name!r} has no attribute {attr!r}"
            )
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise PolicyLoadError(f"policy.serve {spec!r}: {attr!r} is not a class")
    return obj


def coerce_kwargs(cls: type, kwargs: dict[str, Any], spec: str) -> dict[str, Any]:
    """Convert str values to the int/float/bool the constructor's annotations name.

    Unknown names are refused unless the constructor takes **kwargs.
    """
    params = inspect.signature(cls).parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: leave the values as given
        hints = {}
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name not in params and not open_ended:
            known = ", ".join(n for n in params if n != "self") or "none"
            raise PolicyLoadError(f"policy {spec!r}: unknown argument {name!r} (takes: {known})")
        out[name] = _coerce(value, hints.get(name), f"policy {spec!r}: argument {name!r}")
    return out


def _coerce(value: Any, hint: Any, where: str) -> Any:
    if not isinstance(value, str) or hint not in (int, float, bool):
        return value
    if hint is bool:
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise PolicyLoadError(f"{where}: {value!r} is not a boolean (true/false)")
    try:
        return hint(value)
    except ValueError:
        raise PolicyLoadError(f"{where}: {value!r} is not {hint.__name__}") from None


def declared_attr(policy: Any, name: str, kind: type, spec: str) -> Any:
    value = getattr(policy, name, None)
    if value is None or isinstance(value, kind):
        return value
    raise PolicyLoadError(
        f"policy {spec!r}: attribute {name!r} must be a "
        f"robotd.contract.{kind.__name__} or None, got {type(value).__name__}"
    )


def accepts_keyword(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def names_keyword(fn: Any, name: str) -> bool:
    """fn has a parameter of that name (a **kwargs catch-all does not count: taking the
    frozen prefix changes what the robot plays, so it must be asked for by name)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
