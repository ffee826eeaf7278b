"""Differences between two contracts, line by line (the warning when a config's contract
differs from the one the worker declares)."""

from __future__ import annotations

from typing import Any

from robotd.contract.models import Camera, Observations
from robotd.contract.rules import _num


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
