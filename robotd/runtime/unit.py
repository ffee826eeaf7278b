"""The systemd unit for an installation of robotd (`robotd unit [--prefix PATH]`).

The unit is hardened to what the daemon needs and no more: realtime scheduling and
memory locking (CAP_SYS_NICE, CAP_IPC_LOCK, nothing else), /dev/shm for its frame
rings, the serial (ttyUSB, ttyACM) and video devices of its drivers, unix and
internet sockets, its run directory (/run/robotd) and state directory
(/var/lib/robotd, for traces); the rest of the file system read-only, home
directories hidden, system calls limited to @system-service. systemd/robotd.service
in the source tree is this, rendered for /opt/robotd.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_PREFIX = Path("/opt/robotd")
DEFAULT_CONFIG = "/etc/robotd/robot.toml"

UNIT = """\
# robotd under systemd. Made by `robotd unit --prefix {prefix}`; see docs/operations.md.
#
# Type=notify: READY once the control loop ticks; the watchdog is petted only while the
# loop's tick counter advances (a stuck loop is restarted, and a restart starts latched).
# The sandbox leaves the daemon what a robot needs: SCHED_FIFO and mlockall
# (CAP_SYS_NICE, CAP_IPC_LOCK), /dev/shm, serial and video devices, unix and inet
# sockets, /run/robotd (sockets) and /var/lib/robotd (traces).
[Unit]
Description=robotd realtime robot control daemon
After=network-online.target
Wants=network-online.target

[Service]
Type=notify
NotifyAccess=main
ExecStart={exec_start}
Restart=on-failure
RestartSec=2
WatchdogSec=5
TimeoutStartSec=60
TimeoutStopSec=15
KillMode=control-group
KillSignal=SIGTERM

# The user and groups come from sysusers.d/robotd.conf (dialout, video: the devices).
User=robotd
Group=robotd
RuntimeDirectory=robotd
RuntimeDirectoryMode=0750
StateDirectory=robotd
StateDirectoryMode=0750
UMask=0027

# Realtime: SCHED_FIFO and locked memory, and no other privilege.
CapabilityBoundingSet=CAP_SYS_NICE CAP_IPC_LOCK
AmbientCapabilities=CAP_SYS_NICE CAP_IPC_LOCK
LimitRTPRIO=95
LimitMEMLOCK=infinity
Nice=-5
NoNewPrivileges=yes

# Files: everything read-only but /run/robotd, /var/lib/robotd, /dev/shm and a private /tmp.
ProtectSystem=strict
ProtectHome={protect_home}
PrivateTmp=yes
PrivateMounts=yes
PrivateIPC=yes
RemoveIPC=yes

# Devices: serial adapters (ttyUSB, ttyACM) and cameras (video4linux) only.
DevicePolicy=closed
DeviceAllow=char-ttyUSB rw
DeviceAllow=char-ttyACM rw
DeviceAllow=char-video4linux rw

# The kernel, other processes and the host are not the daemon's business.
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
KeyringMode=private
LockPersonality=yes
MemoryDenyWriteExecute=yes
RestrictNamespaces=yes
RestrictSUIDSGID=yes
# (no RestrictRealtime: the control loop runs SCHED_FIFO)

# Sockets: ipc (unix) for the lanes and operators, tcp for the policy worker and CURVE.
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
"""


def _systemd_word(text: str) -> str:
    """One ExecStart word: specifiers escaped (% → %%), quoted when it holds spaces."""
    text = text.replace("%", "%%")
    if any(c.isspace() or c in "\"'\\;" for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _under_home(path: Path) -> bool:
    return any(path == p or p in path.parents for p in (Path("/home"), Path("/root")))


def _prefix(prefix: Path | None) -> Path:
    return Path(prefix).absolute() if prefix is not None else Path(sys.prefix)


def exec_start_problem(prefix: Path | None = None) -> str | None:
    """Why the unit's ExecStart program (`prefix`/bin/robotd) could not be started, naming
    it; None when it is an executable file. (systemd would refuse it only when the service
    starts: "is not executable".)"""
    robotd = _prefix(prefix) / "bin" / "robotd"
    if not robotd.exists():
        return f"{robotd} does not exist (is robotd installed at {robotd.parent.parent}?)"
    if not robotd.is_file():
        return f"{robotd} is not a file"
    if not os.access(robotd, os.X_OK):
        return f"{robotd} is not executable"
    return None


def render_unit(prefix: Path | None = None, *, config: str = DEFAULT_CONFIG) -> str:
    """The unit for robotd installed at `prefix` (its bin/robotd), by default the Python
    environment running this. An installation under /home or /root gets ProtectHome=
    read-only (hidden, the daemon could not start). It names `prefix`/bin/robotd whether
    or not it is there: `robotd unit` checks it first (exec_start_problem)."""
    prefix = _prefix(prefix)
    robotd = prefix / "bin" / "robotd"
    words = [str(robotd), "run", "--config", config, "--no-status"]
    exec_start = " ".join(_systemd_word(w) for w in words)
    interpreter = Path(sys.executable).resolve() if prefix == Path(sys.prefix) else prefix
    home = _under_home(prefix) or _under_home(interpreter)
    return UNIT.format(
        prefix=prefix, exec_start=exec_start, protect_home="read-only" if home else "yes"
    )
