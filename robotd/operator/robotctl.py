"""`robotctl`: the operator's command-line client, with a live view.

    robotctl status | start | stop | estop | clear_fault | reset_done | params | stats
    robotctl verdict --success|--failure [--notes TEXT]
    robotctl watch          # live view from the telemetry socket

The endpoint comes from --endpoint, else from the robot config's run directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from robotd import wire
from robotd.config import DEFAULT_CONFIG, load_config, runtime_dir
from robotd.errors import ConfigError
from robotd.operator.server import endpoints

COMMANDS = [
    "status",
    "start",
    "stop",
    "estop",
    "clear_fault",
    "reset_done",
    "params",
    "stats",
    "verdict",
    "watch",
]


class ControlClient:
    """A DEALER on the operator socket; one request at a time, each with its own id."""

    def __init__(self, endpoint: str, timeout_s: float = 3.0) -> None:
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.timeout_ms = int(timeout_s * 1000)
        self._id = int(time.time() * 1000) % 1_000_000

    def request(self, cmd: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        self.sock.send(wire.packb({"id": self._id, "cmd": cmd, "args": args or {}}))
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0 or not self.sock.poll(left):
                raise TimeoutError(f"no reply to {cmd!r} within {self.timeout_ms} ms")
            reply = wire.unpackb(self.sock.recv())
            if isinstance(reply, dict) and reply.get("id") == self._id:
                return reply

    def close(self) -> None:
        self.sock.close(linger=0)


def estop_direct(control_endpoint: str, reason: str = "", timeout_s: float = 1.0) -> bool:
    """Send an e-stop straight to the control lane's own socket (lane.sock, beside
    control.sock) and wait for its acknowledgement; False when none comes (no lane there)."""
    from robotd.lane import codec
    from robotd.lane.messages import Estop, Reply

    if not control_endpoint.startswith("ipc://"):
        return False
    lane = Path(control_endpoint.removeprefix("ipc://")).parent / "lane.sock"
    if not lane.exists():
        return False
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"ipc://{lane}")
        sock.send(codec.encode(Estop(1, reason or "robotctl direct")), zmq.NOBLOCK)
        if not sock.poll(int(timeout_s * 1000)):
            return False
        reply = codec.decode_up(sock.recv())
        return isinstance(reply, Reply) and reply.ok
    except (zmq.ZMQError, codec.LaneError):
        return False
    finally:
        sock.close()


def _endpoints(args: argparse.Namespace) -> tuple[str, str]:
    if args.endpoint:
        return args.endpoint, args.telemetry or args.endpoint.replace(
            "control.sock", "telemetry.sock"
        )
    cfg = load_config(args.config)
    return endpoints(cfg, runtime_dir(cfg))


def watch(telemetry: str, seconds: float | None) -> int:
    from rich.live import Live
    from rich.table import Table

    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"status")
    sock.connect(telemetry)
    end = None if seconds is None else time.monotonic() + seconds

    def table(msg: dict[str, Any]) -> Table:
        t = Table(title="robotd", show_header=False)
        st = msg.get("state", {})
        lat = msg.get("lateness_us", {})
        t.add_row(
            "state", f"{st.get('state')} (episode {st.get('episode')}, step {st.get('step')})"
        )
        t.add_row("rate", f"{msg.get('hz', 0):.1f} Hz, lateness p99 {lat.get('p99', 0):.0f} µs")
        t.add_row("queue", f"{st.get('queue')} rows, act in flight: {st.get('in_flight')}")
        for k, v in (msg.get("counters") or {}).items():
            t.add_row(k, str(v))
        if st.get("fault"):
            t.add_row("fault", json.dumps(st["fault"]))
        return t

    with Live(refresh_per_second=4) as live:
        while end is None or time.monotonic() < end:
            if sock.poll(500):
                _, data = sock.recv_multipart()
                live.update(table(wire.unpackb(data)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="robotctl", description="Drive a running robotd.")
    p.add_argument("command", choices=COMMANDS)
    p.add_argument("--endpoint", default=os.environ.get("ROBOTD_ENDPOINT"))
    p.add_argument("--telemetry", default=None)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--timeout", type=float, default=3.0)
    v = p.add_mutually_exclusive_group()
    v.add_argument("--success", action="store_true", help="verdict: the episode succeeded")
    v.add_argument("--failure", action="store_true", help="verdict: the episode failed")
    p.add_argument("--notes", default="", help="verdict notes")
    p.add_argument("--reason", default="", help="estop reason")
    p.add_argument("--seconds", type=float, default=None, help="watch: stop after this long")
    args = p.parse_args(argv)
    try:
        control, telemetry = _endpoints(args)
    except (ConfigError, ValueError) as exc:
        print(f"robotctl: {exc}", file=sys.stderr)
        return 2
    if args.command == "watch":
        return watch(telemetry, args.seconds)
    cmd_args: dict[str, Any] = {}
    if args.command == "verdict":
        if not (args.success or args.failure):
            print("robotctl: verdict needs --success or --failure", file=sys.stderr)
            return 2
        cmd_args = {"success": bool(args.success), "notes": args.notes}
    if args.command == "estop" and args.reason:
        cmd_args = {"reason": args.reason}
    client = ControlClient(control, args.timeout)
    try:
        reply = client.request(args.command, cmd_args)
    except TimeoutError as exc:
        if args.command == "estop" and estop_direct(control, args.reason):
            print(
                "robotctl: the main process did not answer; e-stop sent straight to the "
                "control lane",
                file=sys.stderr,
            )
            return 0
        print(f"robotctl: {exc} (is robotd running at {control}?)", file=sys.stderr)
        return 3
    finally:
        client.close()
    if reply.get("ok"):
        print(json.dumps(reply.get("result"), indent=2, default=str))
        return 0
    err = reply.get("error") or {}
    print(f"robotctl: {args.command}: {err.get('code')}: {err.get('message')}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
