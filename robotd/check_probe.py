"""`robotd check --probe`: after the config-only checks, the servo arm's bus itself, read
only (drivers.servo.probe: PING and READ, never a write, torque never touched).

Per configured joint: does its servo ID answer, is the model one the driver knows, and
does its position (as the driver will read it once its open has written the
calibration's homing offset) lie in the calibrated range. Every problem is reported, not
the first: each as `robotd: SOURCE: KEY: joint 'NAME' id N: why` on stderr, the key the
one to look at (ids for a silent servo, with the IDs that did answer a scan of the bus;
joints.driver for a model; joints.options.calibration for a range; joints.options.port
for the port and for replies that are not well formed; `--probe` in place of SOURCE: KEY
for a condition the servo itself reports, as overload). stdout gets a table for people,
or with --json one JSON object on one line (the last). Exit 0 when all is well, else 2.

A config check that fails stops the probe, except a calibration that is missing: an arm
not yet calibrated is probed (its IDs must answer before `robotd calibrate` can run), its
positions reported but not judged, and the exit is still 2 (robotd run would refuse it).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from drivers.servo.calibration import Calibration, load_calibration, resolve_path
from drivers.servo.options import ServoOptions
from drivers.servo.probe import (
    MODEL_NAMES,
    Scan,
    ServoReading,
    open_bus,
    position_after_open,
    probe_servos,
)
from drivers.servo.transport import TransportError
from robotd.config import Loaded

SERVO_DRIVERS = ("dynamixel", "feetech")
HELD = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EBUSY)


@dataclass
class Row:
    """One joint's line of the report; `problems` as (config key, why), the key "" when
    the problem is the servo's own (a condition it reports), no key of the config's."""

    joint: str
    reading: ServoReading
    model_name: str | None = None
    position: int | None = None
    span: tuple[int, int] | None = None
    notes: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)

    def verdict(self) -> str:
        said = [why for _, why in self.problems] + self.notes
        return "; ".join(said) if said else "ok"

    def as_json(self) -> dict[str, object]:
        r = self.reading
        return {
            "joint": self.joint,
            "id": r.ident,
            "answered": r.answered,
            "model": r.model,
            "model_name": self.model_name,
            "present": r.position,
            "position": self.position,
            "range": list(self.span) if self.span else None,
            "ok": not self.problems,
            "verdict": self.verdict(),
        }


def probe_check(loaded: Loaded, problems: list[str], *, scan: bool, as_json: bool) -> int:
    """The probe after the config-only checks, whose `problems` (lines, as check prints
    them) it prints first; the exit code (module docstring)."""
    refused = _not_probed(loaded, problems)
    if refused is not None:
        return _refused([*problems, refused], as_json)
    options, driver = loaded.joint_options, loaded.config.joints.driver
    assert isinstance(options, ServoOptions)
    cal_path = _calibration_path(loaded, options)
    cal = load_calibration(cal_path) if cal_path.exists() else None
    try:
        bus = open_bus(driver, options.port, options.baud, options.low_latency)
    except TransportError as exc:
        return _refused([*problems, open_problem(loaded, options.port, exc)], as_json)
    try:
        readings, found = probe_servos(driver, bus, options.ids, scan=scan)
    except TransportError as exc:  # the port went away under the probe (unplugged)
        return _refused([*problems, f"{loaded.blame('joints.options.port')}: {exc}"], as_json)
    finally:
        bus.transport.close()
    wants = options.models or [None] * len(readings)
    names = loaded.config.joints.names
    rows = [judge(driver, *each, cal, found) for each in zip(names, readings, wants, strict=True)]
    lines = list(problems)
    for row in rows:
        for key, why in row.problems:
            named = loaded.blame(key) if key else "--probe"
            lines.append(f"{named}: joint {row.joint!r} id {row.reading.ident}: {why}")
    _print(rows, found, lines, options.port, driver, as_json)
    return 2 if lines else 0


def _not_probed(loaded: Loaded, problems: list[str]) -> str | None:
    """Why the bus is not to be read: not a servo arm, or a config problem other than a
    calibration not made yet (the one that does not stop the probe: module docstring)."""
    options, driver = loaded.joint_options, loaded.config.joints.driver
    if driver not in SERVO_DRIVERS or not isinstance(options, ServoOptions):
        servos = ", ".join(SERVO_DRIVERS)
        return (
            f"{loaded.blame('joints.driver')}: --probe reads servo arms ({servos}), not {driver!r}"
        )
    missing = f"no calibration at {_calibration_path(loaded, options)}"
    if any(missing not in p for p in problems):
        return "--probe: not probed until the config's problems are mended"
    return None


def _calibration_path(loaded: Loaded, options: ServoOptions) -> Path:
    """Where the arm's calibration is (or is to be), as the config's preflight found it."""
    return resolve_path(options.calibration, Path(loaded.where).resolve().parent)


def judge(
    protocol: str,
    joint: str,
    r: ServoReading,
    want: str | None,
    cal: Calibration | None,
    found: Scan | None,
) -> Row:
    """One joint's row: what its servo answered set against the driver's models, the model
    joints.options.models wants of it (None: any), and the calibration (None: none yet,
    positions not judged)."""
    row = Row(joint, r)
    if r.fault is not None:
        # silence or another ID answering is the ID set wrong (the commonest fault); a
        # reply that is not well formed is the bus (baud, wiring, a second master)
        wrong_id = r.fault_kind in ("silent", "stray")
        key = "joints.options.ids" if wrong_id else "joints.options.port"
        row.problems.append((key, r.fault + ("" if r.answered else _on_the_bus(found))))
    if r.condition is not None:
        # the servo's own state, no key of the config's: said as the probe's
        row.problems.append(("", f"the servo reports {r.condition}"))
    if r.model is not None:
        known = MODEL_NAMES[protocol]
        row.model_name = known.get(r.model)
        if row.model_name is None:
            names = ", ".join(f"{n} ({m})" for m, n in sorted(known.items()))
            why = f"model {r.model} is not one the {protocol} driver knows: {names}"
            row.problems.append(("joints.driver", why))
        elif want is not None and row.model_name != want:
            why = f"a {row.model_name}, the config wants a {want}: another arm on this port?"
            row.problems.append(("joints.options.models", why))
    j = cal.joints.get(joint) if cal is not None else None
    if j is None:
        if r.position is not None:
            row.position = r.position
            row.notes.append("not calibrated: position not judged")
        return row
    row.span = (j.range_min, j.range_max)
    row.position = position_after_open(protocol, r, j.homing_offset, j.drive_mode)
    if row.position is None and r.position is not None:
        row.notes.append(
            f"drive mode {r.drive_mode} here, {j.drive_mode} in the calibration (the driver "
            "writes it at open): position not judged"
        )
    elif row.position is not None and not j.range_min <= row.position <= j.range_max:
        why = f"position {row.position} outside the calibrated range {j.range_min}..{j.range_max}"
        row.problems.append(("joints.options.calibration", why))
    return row


def _on_the_bus(found: Scan | None) -> str:
    """What a scan saw, for a servo that did not answer its ping ("" when none was run)."""
    if found is None:
        return ""
    ids = ", ".join(map(str, found.found)) or "none"
    cut = "" if found.stopped_at is None else f" (scan stopped at id {found.stopped_at})"
    return f"; on the bus: ids {ids}{cut}"


def open_problem(loaded: Loaded, port: str, exc: TransportError) -> str:
    """The port that cannot be opened, with its errno: held by another process (the
    exclusive lock the driver takes), absent, or not ours to open."""
    number = next(
        (n for c in (exc, exc.__cause__, exc.__context__) if (n := getattr(c, "errno", None))),
        None,
    )
    named = f"errno {number} ({errno.errorcode.get(number, '?')})" if number else "no errno"
    if number in HELD or "exclusively lock" in str(exc):
        why = (
            f"{port} is held by another process ({named}), likely the running daemon: stop "
            "it first (systemctl stop robotd, or Ctrl-C the robotd run)"
        )
    else:
        why = f"cannot open {port} ({named}: {os.strerror(number) if number else exc})"
    return f"{loaded.blame('joints.options.port')}: {why}"


def _refused(problems: list[str], as_json: bool) -> int:
    """Problems that kept the bus from being read: each said, exit 2."""
    for line in problems:
        print(f"robotd: {line}", file=sys.stderr)
    if as_json:
        print(json.dumps({"ok": False, "probed": False, "problems": problems}))
    return 2


def _print(
    rows: list[Row], found: Scan | None, lines: list[str], port: str, protocol: str, as_json: bool
) -> None:
    for line in lines:
        print(f"robotd: {line}", file=sys.stderr)
    if as_json:
        scan = None
        if found is not None:
            scan = {"found": found.found, "last_id": found.last, "stopped_at": found.stopped_at}
        report = {
            "ok": not lines,
            "probed": True,
            "port": port,
            "protocol": protocol,
            "joints": [row.as_json() for row in rows],
            "scan": scan,
            "problems": lines,
        }
        print(json.dumps(report))
        return
    console = Console(file=sys.stdout, width=120, highlight=False, soft_wrap=False)
    console.print(f"{protocol} bus on {port}, read only:")
    console.print(_table(rows))
    if found is not None:
        console.print(f"scan of ids 0..{found.last}:{_on_the_bus(found).removeprefix(';')}")
    said = "all well" if not lines else f"{len(lines)} problem(s), each on stderr"
    console.print(f"probe: {said} (nothing written, torque untouched)")


def _table(rows: list[Row]) -> Table:
    table = Table()
    for column in ("joint", "id", "model", "position", "range", "verdict"):
        table.add_column(column, overflow="fold")
    for row in rows:
        r = row.reading
        model = "—" if r.model is None else f"{row.model_name or '?'} ({r.model})"
        table.add_row(
            row.joint,
            str(r.ident),
            model,
            "—" if row.position is None else str(row.position),
            "—" if row.span is None else f"{row.span[0]}..{row.span[1]}",
            row.verdict(),
        )
    return table
