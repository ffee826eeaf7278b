"""Test policies that run in a worker process of their own: the short directory their
module is written to, the `robotd serve` process that runs them, and the report they
write for the test to read."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def short_dir(prefix: str, files: Mapping[str, str]) -> Iterator[Path]:
    """For `yield from` in a fixture: a fresh directory directly under the system's temp
    directory (ipc paths are limited to ~107 bytes, and pytest's tmp_path can be longer),
    holding `files` (name: text); removed, with all that is in it, when resumed."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    for name, text in files.items():
        (path / name).write_text(text)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def serve_child(
    policy: str,
    endpoint: str,
    out: Path,
    *,
    args: Sequence[str] = (),
    pythonpath: Sequence[Path] = (),
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m robotd serve POLICY --bind ENDPOINT` (each of `args` as an --arg) as a
    child process for the block: run from the repo root, with `pythonpath` and then the
    repo root on its PYTHONPATH, its stdout and stderr into `out`. After the block it gets
    SIGTERM and is waited for (subprocess.TimeoutExpired if it takes over 10 s)."""
    path = os.pathsep.join(str(p) for p in (*pythonpath, ROOT))
    with out.open("w") as sink:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "robotd", "serve", policy, "--bind", endpoint),
                *(a for arg in args for a in ("--arg", arg)),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        yield worker
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=10)


def write_report(path: str, found: Mapping[str, Any]) -> None:
    """`found` as JSON at `path`, replaced whole (written beside it, then renamed over it):
    a test reading it at any moment sees a whole report, never half of one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as out:
        json.dump(found, out)
    os.replace(tmp, path)
