"""Shared helpers for the bench scripts: tables, the --json last line, child runs, stats.

Conventions every bench follows:
  - runnable as ``python bench/<name>.py`` from the repo root (call
    :func:`ensure_repo_on_path` before importing robotd);
  - a human table on stdout, and with ``--json`` one JSON object as the LAST line
    (:func:`emit_json`), so a harness can ``stdout.splitlines()[-1]``;
  - a failure is a :class:`BenchError` with a clear message; :func:`run_main` turns it
    into ``error: ...`` on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

REPO_ROOT = Path(__file__).resolve().parent.parent

__all__ = [
    "REPO_ROOT",
    "BenchError",
    "child_env",
    "emit_json",
    "ensure_repo_on_path",
    "fmt",
    "last_json_line",
    "median",
    "print_table",
    "ratio",
    "run_json_child",
    "run_logged",
    "run_main",
    "start_serve",
    "tail",
]


class BenchError(RuntimeError):
    """A bench cannot go on; the message says what and why."""


def ensure_repo_on_path() -> Path:
    """Put the repo root first on sys.path (so ``import robotd`` works) and return it."""
    root = str(REPO_ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)
    return REPO_ROOT


def child_env() -> dict[str, str]:
    """The environment for a child Python: ours, with the repo root on PYTHONPATH."""
    env = dict(os.environ)
    parts = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: floats with ``digits`` decimals, None as '-', the rest as str."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def print_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str | None = None,
    digits: int = 1,
    file: TextIO | None = None,
) -> None:
    """Print an aligned plain-text table (first column left-aligned, the rest right)."""
    out = file or sys.stdout
    cells = [[fmt(v, digits) for v in row] for row in rows]
    for n, row in enumerate(cells):
        if len(row) != len(headers):
            raise ValueError(f"print_table: row {n} has {len(row)} cells, {len(headers)} headers")
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]

    def line(row: Sequence[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(row[1:], widths[1:]))
        return "  ".join([first, *rest]).rstrip()

    if title:
        print(title, file=out)
    print(line(headers), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in cells:
        print(line(row), file=out)
    out.flush()


def emit_json(obj: Mapping[str, Any]) -> None:
    """Print ``obj`` as one compact JSON line; call it last, after every other output."""
    sys.stdout.flush()
    print(json.dumps(obj, separators=(", ", ": "), allow_nan=False), flush=True)


def last_json_line(text: str, *, what: str) -> dict[str, Any]:
    """Parse the last non-empty line of ``text`` as a JSON object (BenchError if not)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise BenchError(f"{what}: printed nothing on stdout (expected a JSON last line)")
    try:
        obj = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise BenchError(
            f"{what}: last stdout line is not JSON ({exc}): {lines[-1][:200]!r}"
        ) from None
    if not isinstance(obj, dict):
        raise BenchError(f"{what}: last stdout line is JSON but not an object: {lines[-1][:200]!r}")
    return obj


def tail(text: str, n: int = 20) -> str:
    """The last ``n`` lines of ``text``, indented, for an error message."""
    lines = text.strip().splitlines()[-n:]
    return "\n".join("    " + ln for ln in lines) if lines else "    (nothing)"


def run_json_child(
    cmd: Sequence[str], *, timeout_s: float, what: str, cwd: Path = REPO_ROOT
) -> dict[str, Any]:
    """Run ``cmd``, wait up to ``timeout_s``, return the JSON object of its last stdout line.

    A non-zero exit, a timeout or a missing/invalid JSON line raises BenchError
    naming ``what`` and showing the tail of the child's stderr.
    """
    try:
        proc = subprocess.run(
            list(cmd),
            cwd=cwd,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise BenchError(
            f"{what}: no answer within {timeout_s:.0f} s; stderr:\n{tail(err)}"
        ) from None
    except OSError as exc:
        raise BenchError(f"{what}: cannot start {cmd[0]!r}: {exc}") from exc
    if proc.returncode != 0:
        raise BenchError(
            f"{what}: exited with status {proc.returncode}; stderr:\n{tail(proc.stderr)}"
        )
    return last_json_line(proc.stdout, what=what)


def run_logged(
    cmd: Sequence[str], *, timeout_s: float, log: Path, what: str, cwd: Path = REPO_ROOT
) -> None:
    """Run ``cmd`` with stdout+stderr into ``log``; BenchError (with the log's tail) on failure.

    For long-running children (the daemon) whose output is a log, not a result.
    """
    with log.open("w") as out:
        try:
            proc = subprocess.run(
                list(cmd),
                cwd=cwd,
                env=child_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            text = log.read_text(errors="replace")
            raise BenchError(
                f"{what}: still running after {timeout_s:.0f} s; log:\n{tail(text)}"
            ) from None
        except OSError as exc:
            raise BenchError(f"{what}: cannot start {cmd[0]!r}: {exc}") from exc
    if proc.returncode != 0:
        text = log.read_text(errors="replace")
        raise BenchError(f"{what}: exited with status {proc.returncode}; log:\n{tail(text)}")


def start_serve(
    policy: str, *args: str, listening: str, what: str
) -> tuple[subprocess.Popen[str], re.Match[str]]:
    """Start ``python -m robotd serve POLICY ARGS...`` (stdout piped, stderr dropped) and read
    its first stdout line, which must match the regex ``listening`` (serve's "listening on
    ..." line, with groups for the endpoints a bench needs). Returns the running process,
    which the caller stops, and the match. When the line does not match, the process is
    killed and BenchError says ``what`` did not start, with the line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "robotd", "serve", policy, *args],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # serve prints it once bound: no polling for the socket
    found = re.search(listening, line)
    if not found:
        proc.kill()
        raise BenchError(f"{what} did not start: {line.strip() or 'no output'}")
    return proc, found


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (BenchError when there are none)."""
    vals = list(values)
    if not vals:
        raise BenchError("median of no values")
    return float(statistics.median(vals))


def ratio(
    num: float | None, den: float | None, digits: int = 3, *, floor: float = 0.0
) -> float | None:
    """``max(num, floor) / max(den, floor)`` rounded, or None when either is missing or
    the floored ``den`` is not > 0. A floor keeps two values lost in measurement noise
    (e.g. sub-µs lateness) from making a meaningless ratio."""
    if num is None or den is None:
        return None
    num, den = max(num, floor), max(den, floor)
    if not den > 0:
        return None
    return round(num / den, digits)


def run_main(main: Callable[[], int | None]) -> None:
    """Run a bench's main(): BenchError → 'error: ...' on stderr, exit 2; ^C → exit 130."""
    try:
        code = main()
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    sys.exit(code or 0)
