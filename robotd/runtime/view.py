"""A narrow, read-only view of the running daemon, for the operator server, telemetry and
the status line: the lane's state, the run's numbers, the policy link's state. Nothing in
it can change the daemon; commands go through `LaneCommands`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from robotd.lane.messages import Reply, Status
from robotd.runtime.summary import RunSummary


class LaneCommands(Protocol):
    """How operator commands reach the control lane (robotd.runtime.bridge.LaneBridge)."""

    async def command(
        self, cmd: str, *, reason: str = "", task: str = "", timeout_s: float = 5.0
    ) -> Reply: ...


def status_dict(status: Status | None) -> dict[str, Any]:
    """A lane Status as plain data (empty for None)."""
    if status is None:
        return {}
    out = msgspec.structs.asdict(status)
    if status.fault is not None:
        out["fault"] = msgspec.structs.asdict(status.fault)
    return out


class PolicyParams(Protocol):
    """How operators read and set the policy's inference parameters (the policy session)."""

    async def params(self, changes: dict[str, Any] | None) -> dict[str, Any]: ...


@dataclass(frozen=True)
class DaemonView:
    """What operators may read: `state()` the lane's latest status as a plain dict (empty
    before the lane first spoke), `summary` the run's numbers, `link()` the policy link's
    state in a few words, `robot_state()` the joints as the last step left them."""

    run_id: str
    robot: str
    summary: RunSummary
    _status: Callable[[], Status | None]
    _link: Callable[[], dict[str, Any]]
    _robot: Callable[[], dict[str, Any]] = field(default=dict)

    def state(self) -> dict[str, Any]:
        return status_dict(self._status())

    def link(self) -> dict[str, Any]:
        return self._link()

    def robot_state(self) -> dict[str, Any]:
        """{"pos", "target", "queue"}: joint positions read and targets written at the last
        step (None before the first), and the rows queued."""
        return self._robot()
