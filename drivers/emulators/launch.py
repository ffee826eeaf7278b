"""Start an emulated bus as a subprocess and get its pty path (tests, the bench, --emulate)."""

from __future__ import annotations

import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence


class EmulatorProcess:
    """A running `python -m drivers.emulators`; `port` is its pty. Stop it with `stop()`
    (or use it as a context manager); it also dies with its parent."""

    def __init__(self, proc: subprocess.Popen[str], port: str) -> None:
        self.proc = proc
        self.port = port

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> EmulatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_emulator(
    protocol: str,
    ids: Sequence[int] = (1, 2, 3, 4, 5, 6),
    *,
    baud: int = 1_000_000,
    model: str | Sequence[str] | None = None,
    faults: Iterable[str] = (),
    timeout_s: float = 20.0,
) -> EmulatorProcess:
    """Start the emulator and wait (at most timeout_s) for its first line, the pty path;
    RuntimeError with what it said when it fails to start."""
    argv = [sys.executable, "-m", "drivers.emulators", protocol, "--ids", ",".join(map(str, ids))]
    argv += ["--baud", str(baud)]
    if model:
        argv += ["--model", model if isinstance(model, str) else ",".join(model)]
    for fault in faults:
        argv += ["--fault", fault]
    # what it says when it fails to start
    errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (outlives this block)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = ""
    while not line.endswith("\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select((proc.stdout,), (), (), max(0.0, left))
        if not ready:
            break
        chunk = proc.stdout.readline()
        if not chunk:
            break
        line += chunk
    port = line.strip()
    if not port.startswith("/dev/"):
        proc.kill()
        proc.wait(5)
        errors.seek(0)
        said = errors.read().strip() or line.strip()
        errors.close()
        raise RuntimeError(f"the {protocol} emulator did not start: {said[-500:]}")
    errors.close()
    return EmulatorProcess(proc, port)
