"""`robotd calibrate` as a person holding the arm meets it, on the bus emulator: a joint
that hardly moved is asked for again (a bounded number of tries, then the error naming
it), and a port another process holds (the running daemon) is said as such."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from drivers.emulators.bus import Emulator
from drivers.servo.calibration import load_calibration
from robotd.operator import calibrate
from tests.servo_util import IDS, NAMES
from tests.test_calibrate import Screen, copy_config, offset

PROTOCOL = "feetech"  # so101.toml


class WalkThrough:
    """calibrate.main on a thread against `emu`, with keys to press and joints to move."""

    def __init__(self, emu: Emulator, config: Path) -> None:
        self.emu, self.screen = emu, Screen()
        self.result: list[int] = []
        r, w = os.pipe()
        self.keys = os.fdopen(w, "w")
        stdin = os.fdopen(r)
        self.thread = threading.Thread(
            target=lambda: self.result.append(
                calibrate.main(["--config", str(config)], stdin=stdin, stdout=self.screen)
            )
        )
        self.at = 0

    def move(self, ident: int, ticks: float) -> None:
        with self.emu.lock:
            self.emu.servos[ident].actual = ticks

    def enter(self) -> None:
        self.keys.write("\n")
        self.keys.flush()

    def wait_for(self, needle: str) -> None:
        self.at = self.screen.wait_for(needle, self.at)

    def sweep(self, ident: int, ends: tuple[int, int], mid: int) -> None:
        """Move servo `ident` to each end, waiting for the readout to show it, then Enter."""
        for end in ends:
            self.move(ident, end)
            self.wait_for(f"now {round(end - offset(PROTOCOL, mid)):>6}")
        self.enter()

    def finish(self) -> int:
        self.thread.join(30)
        self.keys.close()
        assert self.result, "the walk-through did not end:\n" + self.screen.text[-2000:]
        return self.result[0]


@contextmanager
def walk(tmp_path: Path) -> Iterator[tuple[WalkThrough, dict[int, int], Callable[[], None]]]:
    """A walk-through past its first step (the middle pose taken): (it, each servo's
    middle, a function that sweeps every joint not yet done, in order)."""
    mid = {i: 2100 + 37 * i for i in IDS}
    with Emulator(PROTOCOL, IDS) as emu:
        w = WalkThrough(emu, copy_config(tmp_path, "so101.toml", emu.port))
        for i in IDS:
            w.move(i, mid[i])
        w.thread.start()
        w.wait_for("Step 1/2")
        w.enter()
        w.wait_for("Step 2/2")

        def rest(start: int = 0) -> None:
            for i, name in list(zip(IDS, NAMES))[start:]:
                w.wait_for(f"Move {name}")
                w.sweep(i, (mid[i] - 700, mid[i] + 650), mid[i])

        yield w, mid, rest


def test_a_joint_that_hardly_moved_is_asked_for_again(tmp_path):
    with walk(tmp_path) as (w, mid, rest):
        first, name = IDS[0], NAMES[0]
        w.wait_for(f"Move {name}")
        w.enter()  # too soon: nothing moved
        w.wait_for(f"{name} hardly moved")
        w.wait_for("try 2 of 3")
        w.sweep(first, (mid[first] - 500, mid[first] + 400), mid[first])
        rest(1)
        assert w.finish() == 0, w.screen.text[-2000:]
    cal = load_calibration(tmp_path / "so101.calibration.json")
    sign_off = -offset(PROTOCOL, mid[first])
    got = cal.joints[name]
    assert (got.range_min, got.range_max) == (
        mid[first] - 500 + sign_off,
        mid[first] + 400 + sign_off,
    )


def test_a_joint_never_moved_gives_up_after_the_tries_naming_it(tmp_path, capsys):
    with walk(tmp_path) as (w, _, _rest):
        name = NAMES[0]
        w.wait_for(f"Move {name}")
        for attempt in range(2, calibrate.RANGE_TRIES + 1):
            w.enter()
            w.wait_for(f"try {attempt} of {calibrate.RANGE_TRIES}")
        w.enter()
        assert w.finish() == 2
    err = capsys.readouterr().err
    assert f"{name} hardly moved" in err and f"in {calibrate.RANGE_TRIES} tries" in err, err
    assert not (tmp_path / "so101.calibration.json").exists()


HOLDER = """
import sys, serial
port = serial.Serial(sys.argv[1], 1_000_000, exclusive=True)  # as the daemon opens it
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def test_a_port_the_daemon_holds_is_said_as_such(tmp_path, capsys):
    with Emulator(PROTOCOL, IDS) as emu:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, emu.port],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            config = copy_config(tmp_path, "so101.toml", emu.port)
            r, w = os.pipe()
            os.close(w)
            code = calibrate.main(["--config", str(config)], stdin=os.fdopen(r), stdout=Screen())
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(30)
    err = capsys.readouterr().err
    assert code == 2
    assert f"{emu.port} is held by another process, likely the running daemon" in err, err
    assert "stop it first" in err and "Errno" not in err, err
