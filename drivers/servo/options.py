"""Options every serial servo bus driver takes ([joints.options] in a robot config)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pydantic

from drivers.base import DriverOptions


def known_models(models: list[str], known: Iterable[str], servos: str) -> list[str]:
    """`models` lowercased when each is a model `known` (a family's options validator),
    else ValueError naming the first that is not, its place, and the known ones."""
    names = sorted(known)
    out = [m.lower() for m in models]
    for i, m in enumerate(out):
        if m not in names:
            raise ValueError(
                f"models[{i}] {models[i]!r} is not a {servos} model this driver knows "
                f"({', '.join(names)})"
            )
    return out


def configured_models(options: Mapping[str, Any]) -> list[str]:
    """joints.options.models of a raw options table, as the options validator takes them
    (lowercased); [] when not set."""
    return [str(m).lower() for m in options.get("models") or []]


def wrong_model(
    names: Sequence[str], ids: Sequence[int], wants: Sequence[str], got: Mapping[int, str]
) -> tuple[str, str] | None:
    """(joint, words) for the first servo whose model (`got`, by ID) is not the one
    `wants` names for its joint (joints.options.models); None when all match or none is
    named."""
    for name, ident, want in zip(names, ids, wants, strict=False):
        if got.get(ident) != want:
            return name, (
                f"joint {name!r} (servo {ident}) is a {got.get(ident, 'servo of no model')}, "
                f"joints.options.models says {want}: another arm on this port, or a servo "
                "swapped?"
            )
    return None


def fixed_rate(baud: int, rates: Iterable[int], servos: str) -> int:
    """`baud` when it is one of `rates`, the ones a servo family's Baud Rate register can
    hold a code for (a family's options validator), else ValueError naming them: a bus at
    another rate never hears a reply."""
    known = sorted(rates, reverse=True)
    if baud not in known:
        listed = ", ".join(str(r) for r in known)
        raise ValueError(f"{baud} is not a rate {servos} can be set to ({listed})")
    return baud


class ServoOptions(DriverOptions):
    port: str = pydantic.Field(min_length=1)  # /dev/ttyUSB0, /dev/serial/by-id/...
    baud: int = pydantic.Field(1_000_000, gt=0, le=10_000_000)
    ids: list[int] = pydantic.Field(min_length=1, max_length=64)  # one per joint, in order
    grippers: list[str] = []  # joints read and commanded 0..1 over their calibrated range
    calibration: str = "calibration.json"  # relative to the config file's directory
    # per tick: the wait for replies beyond their time on the wire
    timeout_ms: float = pydantic.Field(3.0, gt=0, le=1000)
    retries: int = pydantic.Field(2, ge=0, le=10)  # repeats of a failed read within a tick
    budget_ms: float = pydantic.Field(12.0, gt=0, le=1000)  # a tick's read, all tries
    return_delay_us: int = pydantic.Field(0, ge=0, le=508)  # written to the servos at open
    low_latency: bool = True  # ask the kernel for low-latency mode at open
    # the model each ID must answer as, in ids order (e.g. xl430-w250): a servo of another
    # model (another arm on this port, a servo swapped) is refused at open, before anything
    # is written to it; empty: not checked
    models: list[str] = []

    @pydantic.field_validator("ids")
    @classmethod
    def _ids(cls, ids: list[int]) -> list[int]:
        bad = [i for i in ids if not 0 <= i <= 252]
        if bad:
            raise ValueError(f"servo IDs must be 0..252, got {bad}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate servo ID in {ids}")
        return ids
