"""The control process's start-up spec and its three sockets."""

from __future__ import annotations

import os
from typing import Any

import msgspec
import zmq

from robotd.lane import codec

# An orphaned lane's torque-off that does not get written: tried every tick this long
ORPHAN_WRITE_S = 10.0


def orphan_hold_s(orphan_s: float) -> float:
    """The longest an orphaned lane (its main process gone) stays: control.orphan_s held,
    then its torque-off tried every tick for ORPHAN_WRITE_S, and a margin to exit."""
    return orphan_s + ORPHAN_WRITE_S + 2.0


class ControlSpec(msgspec.Struct, forbid_unknown_fields=True):
    """The control process's single argument (json)."""

    config: dict[str, Any]
    run_id: str
    up: str  # main's PULL, which this process connects to
    down: str  # this process's private PULL (commands, chunks)
    estop: str  # lane.sock: this process's ROUTER that takes the e-stop only
    shm_prefix: str | None = None
    rings: dict[str, str] = {}
    config_dir: str | None = None  # the config file's directory (servo calibration files)


def bind_private(sock: zmq.Socket, endpoint: str, mode: int) -> None:
    """Bind an ipc socket whose file is created with `mode` (the umask makes it so from the
    start: there is no moment when it is wider)."""
    old = os.umask(0o777 & ~mode)
    try:
        sock.bind(endpoint)
    finally:
        os.umask(old)
    if endpoint.startswith("ipc://"):
        os.chmod(endpoint.removeprefix("ipc://"), mode)


class LanePorts:
    """The lane's three sockets: `up` to main (PUSH), `down` from main (PULL, 0600) and
    `estop` (lane.sock, ROUTER, 0660: anyone in the robot's group may stop it)."""

    def __init__(self, spec: ControlSpec) -> None:
        ctx = zmq.Context.instance()
        self.up = ctx.socket(zmq.PUSH)
        self.up.setsockopt(zmq.SNDHWM, 10_000)
        self.up.setsockopt(zmq.LINGER, 500)
        self.up.connect(spec.up)
        self.down = ctx.socket(zmq.PULL)
        self.down.setsockopt(zmq.LINGER, 0)
        # far above the codec's own limit, which refuses (with a reason) what is over it
        self.down.setsockopt(zmq.MAXMSGSIZE, 4 * codec.MAX_MESSAGE_BYTES)
        bind_private(self.down, spec.down, 0o600)
        self.estop = ctx.socket(zmq.ROUTER)
        self.estop.setsockopt(zmq.LINGER, 0)
        self.estop.setsockopt(zmq.MAXMSGSIZE, codec.MAX_ESTOP_BYTES)
        self.estop.setsockopt(zmq.SNDHWM, 100)
        bind_private(self.estop, spec.estop, 0o660)

    def close(self) -> None:
        for sock in (self.up, self.down, self.estop):
            sock.close()
