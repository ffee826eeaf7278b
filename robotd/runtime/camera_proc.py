"""One camera's process: capture frames into a shared-memory ring until told to stop.

    python -m robotd.runtime.camera_proc '{"name": "top", "driver": "sim", "width": 640,
        "height": 480, "fps": 30, "options": {"view": "top"},
        "ring": "robotd-<run>-top", "shm_prefix": "robotd-<run>-"}'

The parent creates the ring and owns it: this process attaches, never unlinks. The
camera is built through the driver factory (drivers.base) and handed the run's
shared-memory prefix in its context. The process dies with its parent, stops on
SIGTERM/SIGINT and exits 0. Optional key "parent_pid": exit at once if that parent is
already gone.

Exit codes: 0 stopped by a signal; 2 usage (bad json, unknown driver, bad options,
missing or mismatched ring); 3 driver fault (a run of bad frames, or the driver gave up
reconnecting). A camera that cannot be opened (a file that is missing or does not decode,
no device) is tried again in this process with backoff (OPEN_RETRY_MIN_S doubling to
OPEN_RETRY_MAX_S) until it opens or a signal: its cause is said once, then again only when
it changes or every RESAY_S with the count of tries (not one line per try for good).
Every failure is one line on stderr naming the camera, in the daemon's own log format
(time, level, logger: robotd.runtime.procutil.setup_logging), so that its lines sort and
read like every other line of the run.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pydantic

from drivers.base import (
    Camera,
    DriverConfigError,
    DriverContext,
    DriverFault,
    build_camera,
)
from drivers.base import (
    CameraSpec as Geometry,
)
from robotd.backoff import Backoff
from robotd.errors import one_line
from robotd.runtime.procutil import (
    die_with_parent,
    install_stop_signals,
    setup_logging,
    sleep_until,
)
from robotd.shm import FrameRing, ShmError

EXIT_OK, EXIT_USAGE, EXIT_DRIVER = 0, 2, 3
MAX_ERRORS_IN_A_ROW = 10  # frame errors the loop tolerates before giving up (exit 3)
OPEN_RETRY_MIN_S = 1.0  # a camera that cannot be opened: the first wait before trying again
OPEN_RETRY_MAX_S = 5.0  # ... doubled up to this
RESAY_S = 60.0  # the same open failure is said again at most this often (with a count)
log = logging.getLogger("robotd.runtime.camera_proc")


class UsageError(Exception):
    """The process was started wrongly: exit 2."""


class CameraSpec(pydantic.BaseModel, extra="forbid"):
    """The process's single argument (json)."""

    name: str = pydantic.Field(min_length=1)
    driver: str = pydantic.Field(min_length=1)
    width: int = pydantic.Field(gt=0)
    height: int = pydantic.Field(gt=0)
    fps: float = pydantic.Field(gt=0)
    options: dict[str, Any] = pydantic.Field(default_factory=dict)
    ring: str = pydantic.Field(min_length=1)
    shm_prefix: str | None = None
    config_dir: str | None = None  # the robot config's directory (relative paths in options)
    parent_pid: int | None = None


def parse_spec(argv: list[str]) -> CameraSpec:
    """The spec from the command line; UsageError naming what is wrong."""
    if len(argv) != 1:
        raise UsageError(f"expected one json argument, got {len(argv)} arguments")
    try:
        return CameraSpec.model_validate_json(argv[0])
    except pydantic.ValidationError as exc:
        raise UsageError(f"bad json spec: {one_line(exc)}") from None


def make_camera(spec: CameraSpec, stop: threading.Event) -> Camera:
    """The camera, built through the driver factory; UsageError for a bad driver or options."""
    context = DriverContext(
        # Sleep in slices so that a stop signal is noticed within ~50 ms at any fps.
        sleep_until=lambda deadline_ns: sleep_until(deadline_ns, stop),
        stop=stop,
        shm_prefix=spec.shm_prefix,
        config_dir=Path(spec.config_dir) if spec.config_dir else None,
        warn=lambda message: _say(f"camera {spec.name!r}", message, logging.WARNING),
    )
    geometry = Geometry(spec.name, spec.width, spec.height, spec.fps)
    try:
        return build_camera(spec.driver, geometry, spec.options, context)
    except DriverConfigError as exc:
        raise UsageError(str(exc)) from None
    except (ValueError, TypeError) as exc:
        raise UsageError(f"bad options for driver {spec.driver!r}: {one_line(exc)}") from None


def capture_loop(camera: Camera, ring: FrameRing, stop: threading.Event, label: str) -> int:
    """Capture until `stop`; frame errors are counted, a run of them is a DriverFault."""
    errors_in_a_row = 0
    errors = 0
    while not stop.is_set():
        try:
            camera.capture(ring)
        except DriverFault:
            raise
        except Exception as exc:
            errors += 1
            errors_in_a_row += 1
            if errors_in_a_row >= MAX_ERRORS_IN_A_ROW:
                raise DriverFault(
                    f"{errors_in_a_row} frame errors in a row, last: {one_line(exc)}"
                ) from exc
            if errors == 1 or errors % 100 == 0:
                _say(label, f"frame error #{errors} (skipped): {one_line(exc)}", logging.WARNING)
            continue
        errors_in_a_row = 0
    return EXIT_OK


def open_until_ready(camera: Camera, stop: threading.Event, label: str) -> bool:
    """Open the camera, trying again with backoff while it raises DriverFault; True once
    open, False when stopped first. The cause is said at the first failure, when it
    changes, and every RESAY_S (with the count), not at every try."""
    tries, last, said_at = 0, "", 0.0
    backoff = Backoff(OPEN_RETRY_MIN_S, OPEN_RETRY_MAX_S)
    while not stop.is_set():
        try:
            camera.open()
        except DriverFault as exc:
            tries += 1
            why = " ".join(str(exc).split()).removeprefix(f"{label}: ")
            now = time.monotonic()
            if why != last:
                _say(
                    label,
                    f"cannot open: {why}; trying again every {OPEN_RETRY_MAX_S:g} s "
                    f"at most (said again when the cause changes, else every {RESAY_S:g} s)",
                    logging.WARNING,
                )
                last, said_at = why, now
            elif now - said_at >= RESAY_S:
                _say(label, f"still cannot open after {tries} tries: {why}", logging.WARNING)
                said_at = now
            if not sleep_until(time.monotonic_ns() + int(backoff.next() * 1e9), stop):
                return False
            continue
        if tries:
            _say(label, f"opened after {tries} failed tries", logging.INFO)
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    """Run one camera process; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    setup_logging()
    try:
        spec = parse_spec(argv)
    except UsageError as exc:
        _say(_guess_label(argv), str(exc))
        return EXIT_USAGE
    label = f"camera {spec.name!r}"
    stop = install_stop_signals()  # first: a self-SIGTERM from die_with_parent is a clean stop
    die_with_parent(spec.parent_pid)
    with contextlib.ExitStack() as stack:
        try:
            ring = FrameRing.attach(spec.ring)
            stack.callback(ring.close)
            camera = make_camera(spec, stop)
            if tuple(camera.shape) != ring.shape:
                raise UsageError(
                    f"ring {spec.ring!r} holds frames of {ring.shape}, camera makes {camera.shape}"
                )
        except (UsageError, ShmError, ValueError) as exc:
            _say(label, str(exc))
            return EXIT_USAGE
        stack.callback(camera.close)
        try:
            if not open_until_ready(camera, stop, label):
                return EXIT_OK
            return capture_loop(camera, ring, stop, label)
        except DriverFault as exc:
            _say(label, f"driver fault: {one_line(exc)}")
            return EXIT_DRIVER


def _say(label: str, message: str, level: int = logging.ERROR) -> None:
    """One log line naming the camera (`label`), its text on one line."""
    log.log(level, "%s: %s", label, " ".join(message.split()))


def _guess_label(argv: list[str]) -> str:
    """Name the camera in a usage error if the json gets that far."""
    with contextlib.suppress(Exception):
        import json

        name = json.loads(argv[0]).get("name")
        if isinstance(name, str) and name:
            return f"camera {name!r}"
    return "camera <unknown>"


if __name__ == "__main__":
    sys.exit(main())
