"""The real openpi packages from PyPI, in a virtual environment of their own.

openpi-client pins numpy < 2 and robotd runs on numpy 2, so openpi-server and
openpi-client live in a separate venv, built on first use and kept (default
`<repo>/.venv-openpi`, or $ROBOTD_OPENPI_VENV) so later runs start at once. The tests
and bench/openpi.py run the peer scripts beside this file with that venv's python.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
# typing-extensions: openpi-client's websocket_client_policy imports it without declaring it
PINS = ("openpi-server==0.1.0", "openpi-client==0.1.2", "typing-extensions>=4.0")
_STAMP = ".robotd-peer-ok"
_failed: str | None = None


class PeerUnavailable(RuntimeError):
    """The openpi packages cannot be installed here; the message says why."""


def venv_dir() -> Path:
    return Path(os.environ.get("ROBOTD_OPENPI_VENV") or REPO / ".venv-openpi")


def peer_python() -> Path:
    """The peer venv's python, building the venv first if needed (PeerUnavailable if the
    packages cannot be installed; the failure is remembered for this process)."""
    global _failed
    if _failed is not None:
        raise PeerUnavailable(_failed)
    root = venv_dir()
    python = root / "bin" / "python"
    stamp = root / _STAMP
    if _ready(stamp):
        return python
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(str(root) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it
        if not _ready(stamp):
            try:
                _build(root, python)
            except PeerUnavailable as exc:
                _failed = str(exc)
                raise
            stamp.write_text("\n".join(PINS) + "\n")
    return python


def _ready(stamp: Path) -> bool:
    return stamp.is_file() and stamp.read_text().split() == list(PINS)


def _run(cmd: list[str], what: str, timeout: float) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"{what}: {exc}") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise PeerUnavailable(f"{what} failed (status {proc.returncode}):\n{tail}")


def _build(root: Path, python: Path) -> None:
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(root)], f"python -m venv {root}", 120)
    _run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS],
        f"pip install {' '.join(PINS)} into {root}",
        600,
    )
    _run(
        [str(python), "-c", "import openpi_server, openpi_client.websocket_client_policy"],
        "importing openpi_server in the peer venv",
        60,
    )
