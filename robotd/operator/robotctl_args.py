"""robotctl's command line: its grammar and the request arguments it makes of it.

The argparse grammar (`parser`: every command, the options that find the daemon, given
before or after the command), the exit codes that are robotctl's contract with scripts
(here because a usage error exits from inside the parser), and the checks that run before
anything is sent: argument text the daemon would refuse is a UsageError naming the
argument, and an e-stop's reason is made sendable instead (an e-stop must always go).
robotd.operator.robotctl runs the parsed command.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from robotd.operator import humane
from robotd.operator.client import DEFAULT_TIMEOUT_S, check_timeout
from robotd.operator.curve import KINDS
from robotd.operator.locate import endpoint_problem
from robotd.operator.requests import MAX_TEXT

EXIT_OK, EXIT_ERROR, EXIT_UNREACHABLE, EXIT_USAGE, EXIT_CONFIG = 0, 1, 2, 64, 78

SIMPLE = ["status", "stop", "estop", "clear_fault", "reset_done", "stats"]
SIMPLE_HELP = {  # what each does to the state machine (robotd/control/episode.py)
    "status": "show the state (IDLE, RUNNING, ENDED, RESETTING, FAULT and its cause), "
    "episode and step",
    "stop": "end the running episode: RUNNING → ENDED (the robot holds where it is)",
    "estop": "emergency stop: latch FAULT (cause e-stop) from any state, torque off by the "
    "config's category; only clear_fault leaves it",
    "clear_fault": "leave FAULT once its cause is gone: FAULT → IDLE (no motion until start)",
    "reset_done": "the scene is reset after an episode: ENDED or RESETTING → IDLE, ready "
    "for the next start (the robot does not move)",
    "stats": "show the run's counters: rate, lateness, acts, holds, shield interventions",
}
WATCH_JSON = "JSON lines on stdout: one object per telemetry update"
WATCH_TEXT = (
    "The live view of the daemon's telemetry. On a terminal: a screen redrawn four times a "
    "second; key e sends an e-stop, q quits. When stdout is not a terminal (a file, a "
    "pipe), a line per update instead, each written at once; with --json, JSON lines: "
    '{"ok": true, "telemetry": MESSAGE} per message, {"ok": false, "error": {code, '
    "message}} when there is no daemon (unreachable) or updates stopped (stale)."
)
PARAMS_HINT = "say: robotctl params set KEY=VALUE"
_UNDECODABLE = re.compile("[\ud800-\udfff]")  # argv bytes that were not UTF-8


class UsageError(ValueError):
    """An argument robotctl cannot send; the message names it."""


def _seconds(text: str) -> float:
    try:
        return check_timeout(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds > 0 (and finite)"
        ) from None


def estop_reason(reason: str) -> str:
    """Any --reason made sendable, for an e-stop must always go: bytes that were not UTF-8
    replaced (U+FFFD), cut to the daemon's limit."""
    clean, limit = _UNDECODABLE.sub("\ufffd", reason), MAX_TEXT["reason"]
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def text_arg(where: str, text: str, limit: int | None = None) -> str:
    """`text` as given when the daemon takes it; UsageError naming `where` otherwise."""
    bad = _UNDECODABLE.search(text)
    if bad is not None:
        at = bad.start()
        raise UsageError(f"{where}: not UTF-8 text (an undecodable byte at character {at})")
    if limit is not None and len(text) > limit:
        raise UsageError(f"{where} is {len(text)} characters; the daemon takes at most {limit}")
    return text


def check_endpoint(endpoint: str | None, where: str) -> None:
    """UsageError when an ipc endpoint names no socket file or a tcp port is no number."""
    if not endpoint or not endpoint.startswith(("ipc://", "tcp://")):
        return  # none given, or no scheme robotd serves: locate says so
    why = endpoint_problem(endpoint)
    if why is not None:
        raise UsageError(f"{where} {endpoint!r}: {why}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's 2 means "unreachable" here
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _options(p: argparse.ArgumentParser, json_help: str, *, inherit: bool) -> None:
    """The options every daemon command takes. Given before the command they go on the
    top parser; after it, on the command's, whose defaults are then SUPPRESSed (`inherit`)
    so that an option given before the command is not reset by the command's default."""

    def dflt(value: Any) -> Any:
        return argparse.SUPPRESS if inherit else value

    p.add_argument("--endpoint", default=dflt(None), help="control socket (default: found)")
    p.add_argument("--telemetry", default=dflt(None), help="telemetry socket (default: beside it)")
    p.add_argument("--config", type=Path, default=dflt(None),
                   help="the robot's config: its runtime.dir and endpoints")  # fmt: skip
    p.add_argument("--server-key", default=dflt(None), help="tcp: the daemon's public .key file")
    p.add_argument("--key", default=dflt(None), help="tcp: this client's .key_secret file")
    p.add_argument("--timeout", type=_seconds, default=dflt(DEFAULT_TIMEOUT_S),
                   help="seconds to wait")  # fmt: skip
    p.add_argument("--json", action="store_true", default=dflt(False), help=json_help)


def _common(json_help: str = "one JSON object on stdout") -> argparse.ArgumentParser:
    c = argparse.ArgumentParser(add_help=False)
    _options(c, json_help, inherit=True)
    return c


def parser() -> argparse.ArgumentParser:
    """robotctl's whole grammar: a subcommand each, the common options on every one."""
    common = _common()
    p = _Parser(
        prog="robotctl",
        description="Drive a running robotd. The options below go before or after the command.",
    )
    _options(p, "one JSON object on stdout (watch: JSON lines)", inherit=False)
    sub = p.add_subparsers(dest="command", required=True)
    for name in SIMPLE:
        s = sub.add_parser(name, parents=[common], help=SIMPLE_HELP[name])
        if name == "estop":
            s.add_argument("--reason", default="", help="why (logged, shown in the fault)")
    start = sub.add_parser("start", parents=[common], help="start an episode: IDLE → RUNNING")
    start.add_argument("--task", default="", help="the episode's task text, for the policy")
    params = sub.add_parser("params", parents=[common], help="show (or set) parameters")
    params.add_argument("action", nargs="?", metavar="set", help="set KEY=VALUE ...")
    params.add_argument("assignments", nargs="*", metavar="KEY=VALUE")
    verdict = sub.add_parser("verdict", parents=[common], help="judge the current episode")
    v = verdict.add_mutually_exclusive_group(required=True)
    v.add_argument("--success", action="store_true")
    v.add_argument("--failure", action="store_true")
    verdict.add_argument("--notes", default="")
    verdict.add_argument("--replace", action="store_true", help="replace an earlier verdict")
    watch = sub.add_parser(
        "watch",
        parents=[_common(WATCH_JSON)],
        help="live view; e sends an e-stop, q quits",
        description=WATCH_TEXT,
    )
    watch.add_argument("--seconds", type=_seconds, default=None, help="stop after this long")
    kg = sub.add_parser("keygen", help="make a CURVE key pair (NAME.key, NAME.key_secret)")
    kg.add_argument("--dir", type=Path, default=None, help="default: ~/.config/robotd")
    kg.add_argument("--name", default="robotctl")
    kg.add_argument("--kind", choices=KINDS, default=None, help="whose pair: robotctl's "
                    "(client) or the daemon's (server); default: server when NAME says "
                    "server (server, robot-server, server2), else client")  # fmt: skip
    kg.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    return p


def request_args(args: argparse.Namespace) -> dict[str, Any]:
    """The request's arguments from the command line (UsageError when unsendable)."""
    if args.command == "start":
        task = text_arg("start --task", args.task, MAX_TEXT["task"])
        return {"task": task} if task else {}
    if args.command == "verdict":
        notes = text_arg("verdict --notes", args.notes, MAX_TEXT["notes"])
        out: dict[str, Any] = {"success": bool(args.success), "notes": notes}
        return {**out, "replace": True} if args.replace else out
    if args.command == "params" and args.action is not None:
        if args.action != "set":
            said = "to change one" if "=" in args.action else f"unknown {args.action!r}"
            raise UsageError(f"params: {said}, {PARAMS_HINT}")
        for item in args.assignments:
            text_arg(f"params set {item.partition('=')[0]!r}", item)
        return {"set": humane.assignments(args.assignments)}
    return {}
