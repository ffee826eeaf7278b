"""What a serial servo arm's config must be before anything runs, judged from files alone:
the port names a character device, and the calibration file is there, is the arm's
(protocol) and names each joint on the servo ID the config gives it. `robotd check` asks
it (`ServoJoints.preflight`) and the driver's `open` applies the same rules, so that the
two say the same sentence.

The port is looked at (os.stat), never opened: the running daemon holds it (opened
exclusively, a second open fails while it runs, the normal state before a restart), and
opening a tty configures it (baud, termios) and may toggle DTR/RTS under the daemon's
feet. Whether the servos answer, and at the configured baud, only the bus itself shows
(`robotd run`, `robotd run --emulate`, bench/serial.py)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from drivers.servo.calibration import Calibration, CalibrationError, load_calibration

KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFREG: "a regular file",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong, about `keys` (the first is the one named): option names of the
    joint driver, or "names" (joints.names); `joint` where one joint is at fault."""

    keys: tuple[str, ...]
    why: str
    joint: str | None = None

    def line(self) -> str:
        """As a preflight reports it: "KEY, KEY: why"."""
        return f"{', '.join(self.keys)}: {self.why}"


def port_problem(port: str) -> Problem | None:
    """A port that names no character device (a serial adapter's node is one; a
    /dev/serial/by-id/ link is followed). Not opened (see the module docstring). Not
    judged off POSIX (COM3 is no path) nor where the path cannot be looked at."""
    if os.name != "posix":
        return None
    try:
        mode = os.stat(port).st_mode
    except FileNotFoundError:
        return Problem(
            ("port",),
            f"cannot open {port}: no such device (is the adapter plugged in? "
            "`ls -l /dev/serial/by-id/` names the ones there)",
        )
    except OSError:
        return None  # not ours to judge (a directory we may not search): the open will say
    if stat.S_ISCHR(mode):
        return None
    kind = KINDS.get(stat.S_IFMT(mode), "not a device")
    return Problem(("port",), f"cannot open {port}: not a serial device ({kind})")


def calibration_problems(
    path: Path, protocol: str, names: Sequence[str], ids: Sequence[int]
) -> tuple[Calibration | None, list[Problem]]:
    """The arm's calibration and what is wrong with it for this config: missing (how to
    make one), unreadable, of another protocol, or a joint it lacks or puts on another
    servo ID than the config (every such joint)."""
    if not path.exists():
        return None, [
            Problem(
                ("calibration",),
                f"no calibration at {path}: torque stays off until the arm is calibrated; "
                "make one with `robotd calibrate --config YOUR_CONFIG.toml` (it walks you "
                "through it), or import LeRobot's with `robotd calibrate --config "
                "YOUR_CONFIG.toml --import-lerobot FILE.json`",
            )
        ]
    try:
        cal = load_calibration(path)
    except CalibrationError as exc:
        return None, [Problem(("calibration",), str(exc))]
    if cal.protocol != protocol:
        why = f"{path}: a {cal.protocol} calibration, this arm is {protocol}"
        return None, [Problem(("calibration", "driver"), why)]
    problems = []
    for name, ident in zip(names, ids):
        j = cal.joints.get(name)
        if j is None:
            why = f"{path}: no calibration for joint {name!r}"
            problems.append(Problem(("calibration", "names"), why, name))
        elif j.id != ident:
            why = f"{path}: joint {name!r} is servo {j.id} there, {ident} in the config"
            problems.append(Problem(("ids", "calibration"), why, name))
    return (None if problems else cal), problems


def preflight(
    protocol: str, names: Sequence[str], port: str, calibration: Path, ids: Sequence[int]
) -> list[str]:
    """Every problem `port_problem` and `calibration_problems` find, as "KEY, KEY: why"
    lines (KEY: an option of the driver, or "names", "driver" of the joints table)."""
    found = [port_problem(port)]
    found += calibration_problems(calibration, protocol, names, ids)[1]
    return [p.line() for p in found if p is not None]
