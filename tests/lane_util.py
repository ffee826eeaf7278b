"""Lane messages as plain dicts for assertions: the tag as "k", an event's details beside
its name, a merge report's first step also as "from" (its wire name before typing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import zmq

from robotd.config import load_config
from robotd.control.ports import ControlSpec
from robotd.control.process import ControlLane
from robotd.control.ticker import Tick
from robotd.lane import codec
from robotd.virtual.runner import T0_NS


def plain(msg: Any) -> dict[str, Any]:
    out = msgspec.to_builtins(msg)
    if out.get("k") == "event":
        out.update(out.pop("detail", {}))
    if out.get("k") == "merged":
        out["from"] = out["from_step"]
    return out


def recv_all(sock: Any, timeout_ms: int = 200) -> list[dict[str, Any]]:
    """Every message waiting on a PULL socket of the control lane's up channel, as dicts."""
    out = []
    while sock.poll(timeout_ms):
        out.extend(plain(m) for m in codec.decode_up_batch(sock.recv()))
    return out


class LaneRig:
    """A ControlLane on config/sim.toml without cameras, ticked by hand on a fake clock:
    the test is the main process (its PULL on up, PUSH on down, DEALER on lane.sock)."""

    def __init__(self, tmp: Path, *overrides: str) -> None:
        self.cfg = load_config(None, ["cameras={}", "control.lock_memory=false", *overrides])
        ctx = zmq.Context.instance()
        self.up = ctx.socket(zmq.PULL)
        self.up.bind(f"ipc://{tmp}/up.sock")
        spec = ControlSpec(
            config=self.cfg.model_dump(mode="json"),
            run_id="virtual",  # the virtual runner's, so worker-side episode ids agree
            up=f"ipc://{tmp}/up.sock",
            down=f"ipc://{tmp}/down.sock",
            estop=f"ipc://{tmp}/lane.sock",
        )
        self.now = T0_NS
        self.lane = ControlLane(spec, clock=lambda: self.now)
        self.down = ctx.socket(zmq.PUSH)
        self.down.connect(spec.down)
        self.estop = ctx.socket(zmq.DEALER)
        self.estop.connect(spec.estop)
        self.index = 0
        self.lane.ticker.start(T0_NS - self.lane.ticker.period_ns)  # tick 0 is due at T0

    def send(self, msg: Any) -> None:
        self.down.send(codec.encode(msg))

    def tick(self) -> list[dict[str, Any]]:
        """One tick at its deadline (sent messages are in the lane's socket by then: ipc
        on one machine delivers before the next poll, and the test waits for it)."""
        self.now = T0_NS + round(self.index * 1e9 / self.cfg.control.hz)
        tick = Tick(self.index, self.now, self.now, 0, 0)
        sent = self.lane.sent
        self.lane.one_tick(tick)
        self.index += 1
        out = []
        for _ in range(self.lane.sent - sent):  # one batch a tick at most: wait for it
            assert self.up.poll(5000), "the lane's batch never arrived"
            out += [plain(m) for m in codec.decode_up_batch(self.up.recv())]
        return out

    def close(self) -> None:
        self.lane.close()
        for sock in (self.up, self.down, self.estop):
            sock.close(linger=0)


def wait_in_socket(sock: zmq.Socket) -> None:
    """Block until the lane's own socket has a message to read (it is the receiver)."""
    assert sock.poll(5000, zmq.POLLIN), "the message never reached the lane's socket"
