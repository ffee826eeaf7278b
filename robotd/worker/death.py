"""Why a copy of the policy stopped, in words: its exit status, and for a SIGKILL whatever
can be found about the kernel's OOM killer (the cgroup's oom_kill counter, the kernel log),
with the copy's last memory use.

Kinds (the `cause` of an episode_lost error): `crashed` (an exit code, or a signal other
than SIGKILL), `out_of_memory` (a MemoryError in the copy, or an OOM kill on record),
`killed` (SIGKILL with no OOM record either way: the message says "out of memory?"),
`hung` (no answer within hang_s; the worker killed it).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from robotd.exits import signal_name

MIB = 1 << 20
KMSG_RECORDS = 20000  # kernel log records read at most, looking for an OOM kill
_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class Loss:
    """Why a copy stopped: `kind` (see the module docstring) and a sentence."""

    kind: str
    message: str
    signal: str | None = None
    exit_code: int | None = None


@dataclass(slots=True)
class Memory:
    """A copy's memory, as last read from /proc (bytes)."""

    rss: int = 0
    peak: int = 0

    def text(self) -> str:
        if not self.rss and not self.peak:
            return "memory use unknown"
        return f"last RSS {self.rss / MIB:.0f} MiB (peak {self.peak / MIB:.0f} MiB)"


def read_memory(pid: int, into: Memory) -> bool:
    """Update `into` from /proc/PID/status (VmRSS, VmHWM); False if it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.MULTILINE))
    if "VmRSS" not in found:
        return False  # a zombie: its memory is gone
    into.rss = int(found["VmRSS"]) * 1024
    into.peak = max(into.peak, int(found.get("VmHWM", 0)) * 1024, into.rss)
    return True


def oom_kills() -> int | None:
    """The OOM kills counted by this process's memory cgroup (v2 memory.events, or v1
    memory.oom_control), or None where neither can be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates: list[Path] = []
    for line in lines:
        _, controllers, path = ([*line.split(":", 2), "", ""])[:3]
        rel = path.strip().lstrip("/")
        if controllers == "":  # cgroup v2
            candidates += [_CGROUP_ROOT / rel / "memory.events", _CGROUP_ROOT / "memory.events"]
        elif "memory" in controllers.split(","):
            base = _CGROUP_ROOT / "memory"
            candidates += [base / rel / "memory.oom_control", base / "memory.oom_control"]
    for candidate in candidates:
        with contextlib.suppress(OSError, ValueError):
            match = re.search(r"^oom_kill (\d+)$", candidate.read_text(), re.MULTILINE)
            if match:
                return int(match.group(1))
    return None


def kernel_log_oom(pid: int, path: str = "/dev/kmsg") -> bool | None:
    """True if the kernel log records an OOM kill of `pid`, False if it does not, None if
    the log cannot be read here."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return any(oom_record_names(record, pid) for record in _records(fd))
    finally:
        os.close(fd)


def _records(fd: int) -> list[str]:
    out: list[str] = []
    while len(out) < KMSG_RECORDS:
        try:
            data = os.read(fd, 8192)
        except BlockingIOError:
            break
        except OSError:  # EPIPE: a record was overwritten while reading; go on
            continue
        if not data:
            break
        out.append(data.decode("utf-8", errors="replace"))
    return out


def oom_record_names(record: str, pid: int) -> bool:
    """Does one kernel log record say the OOM killer killed `pid`? ("Out of memory: Killed
    process 1234 (python) ...", "Memory cgroup out of memory: Killed process 1234 ...", or
    the oom-kill summary line "...,task=python,pid=1234,uid=1000")."""
    text = record.split(";", 1)[-1]
    if re.search(rf"Killed process {pid}\b", text):
        return True
    return "oom-kill:" in text and re.search(rf"[,:]pid={pid}\b", text) is not None


def describe_exit(
    returncode: int, pid: int, memory: Memory, oom_before: int | None, memory_exit: int
) -> Loss:
    """The Loss of a copy that exited by itself with `returncode` (Popen's: negative is a
    signal); `oom_before` is the cgroup's oom_kill counter when the copy started;
    `memory_exit` the exit code a copy uses after a MemoryError."""
    if returncode >= 0:
        if returncode == memory_exit:
            return Loss(
                "out_of_memory",
                f"ran out of memory (MemoryError; exit code {returncode}); {memory.text()}",
                exit_code=returncode,
            )
        return Loss(
            "crashed", f"exited with code {returncode}; {memory.text()}", exit_code=returncode
        )
    signum = -returncode
    name = signal_name(signum)
    if signum != signal.SIGKILL:
        what = signal.strsignal(signum) or name
        return Loss("crashed", f"crashed: killed by {name} ({what}); {memory.text()}", name)
    logged = kernel_log_oom(pid)
    after = oom_kills()
    counted = oom_before is not None and after is not None and after > oom_before
    if logged or counted:
        source = "the kernel log" if logged else f"the cgroup's oom_kill counter rose to {after}"
        return Loss(
            "out_of_memory",
            f"killed by SIGKILL from the kernel's OOM killer ({source}); {memory.text()}",
            name,
        )
    looked = logged is not None or after is not None
    unsure = "no OOM kill on record" if looked else "the kernel's OOM record is not readable here"
    return Loss("killed", f"killed by SIGKILL (out of memory? {unsure}); {memory.text()}", name)
