"""`robotctl`: the operator's command-line client, with a live view.

    robotctl status | stop | estop | clear_fault | reset_done | stats   [--json]
    robotctl start [--task TEXT]
    robotctl params [set KEY=VALUE ...]
    robotctl verdict --success|--failure [--notes TEXT] [--replace]
    robotctl watch [--seconds S] [--json] # live view; `e` sends an e-stop (a line per
                                         # update when stdout is no terminal)
    robotctl keygen [--dir DIR] [--name NAME] [--kind client|server]

The options that find the daemon (--endpoint, --config, ..., --timeout, --json) go before
or after the command.

Exit codes: 0 ok, 1 the daemon answered with an error (status and stats too when it says
the control lane has gone silent), 2 no daemon answered (at once when its socket file is
missing or dead, after --timeout, default 1 s, otherwise), 64 a usage error, 78 a bad
config or key file. Output is for people unless --json (one JSON object on stdout,
errors too; for watch, JSON lines: one object per update).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from robotd.errors import ConfigError
from robotd.lane.messages import NOT_WRITTEN, UNDO_ESTOP
from robotd.operator import humane
from robotd.operator.client import (
    DEFAULT_TIMEOUT_S,
    ControlClient,
    Unreachable,
    check_timeout,
    estop_via_lane,
    request_once,
)
from robotd.operator.curve import KINDS, KeyFileError, key_kind, keygen
from robotd.operator.locate import (
    Handshake,
    Target,
    default_key_file,
    endpoint_problem,
    locate_for,
)
from robotd.operator.requests import MAX_TEXT
from robotd.operator.words import printable
from robotd.pipes import reader_gone

EXIT_OK, EXIT_ERROR, EXIT_UNREACHABLE, EXIT_USAGE, EXIT_CONFIG = 0, 1, 2, 64, 78
__all__ = ["ControlClient", "estop", "main"]

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
# Commands that change something: without a reply in time they may still be carried out.
ACTING = frozenset({"start", "stop", "clear_fault", "reset_done", "verdict"})
PARAMS_HINT = "say: robotctl params set KEY=VALUE"
UNCONFIRMED = frozenset({"timeout", "busy"})  # estop answers that are no confirmation
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


def _parser() -> argparse.ArgumentParser:
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


def _request_args(args: argparse.Namespace) -> dict[str, Any]:
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


class Output:
    """Everything robotctl prints, for people or (--json) for scripts."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json

    def result(self, command: str, result: Any) -> int:
        print(json.dumps(result, default=str) if self.json else humane.result(command, result))
        return EXIT_OK

    def error(self, command: str, code: str, message: str, exit_code: int) -> int:
        if self.json:
            print(json.dumps({"ok": False, "error": {"code": code, "message": message}}))
            return exit_code
        said = [command] if code == command else [command, code]
        for prefix in said:  # the daemon's messages often start with the command's name
            message = message.removeprefix(f"{prefix}: ")
        for line in f"robotctl: {': '.join(said)}: {message}".splitlines():
            print(printable(line), file=sys.stderr)  # a config's problems: a line each
        return exit_code

    def warn(self, message: str) -> None:
        """A warning on stderr (stdout stays one JSON object with --json), a line each."""
        for line in message.splitlines():
            print(printable(f"robotctl: warning: {line}"), file=sys.stderr)


def estop(target: Target, reason: str, timeout_s: float) -> tuple[str, Any]:
    """The e-stop through the daemon, else straight to the control lane.

    ("ok", result) once confirmed; ("error", (code, message)) when the daemon refused;
    ("unreachable", words) when nobody confirmed it (then it never claims success, and
    the words say what is known: humane.estop_unconfirmed). Any `reason` goes, made
    sendable (estop_reason). A daemon that answers `timeout` or `busy` has not confirmed
    it either: the lane is tried then too."""
    reason = estop_reason(reason)
    if target.control.startswith("tcp://") and target.curve is None:  # locate said why
        said = f"the daemon at {target.control} was not asked (no CURVE keys)"
        return _via_lane(target, reason, timeout_s, said)
    handshake = Handshake(target)  # meanwhile: is the daemon's main process up at all?
    try:
        try:
            reply = request_once(
                target.control,
                "estop",
                {"reason": reason} if reason else {},
                timeout_s=timeout_s,
                curve=target.curve,
            )
        except Unreachable as first:
            up = first.sent and handshake.seen()
            said = humane.daemon_unconfirmed(str(first), first.sent, up, target.control, timeout_s)
            return _via_lane(target, reason, timeout_s, said)
        if reply.get("ok"):
            return "ok", reply.get("result")
        err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        code, message = str(err.get("code", "error")), str(err.get("message", ""))
        if code not in UNCONFIRMED:
            return "error", (code, message)
        said = f"the daemon is up but its control lane did not confirm: it said {code}: {message}"
        return _via_lane(target, reason, timeout_s, said)
    finally:
        handshake.close()


def _via_lane(target: Target, reason: str, timeout_s: float, daemon: str) -> tuple[str, Any]:
    """The e-stop to lane.sock after the daemon did not confirm it (`daemon`: what is
    known of the daemon, in words)."""
    try:
        return "ok", estop_via_lane(target.lane_control, reason or "robotctl", timeout_s)
    except Unreachable as lane:
        return "unreachable", humane.estop_unconfirmed(daemon, str(lane))


def _watch_estop(target: Target, timeout_s: float) -> tuple[bool, str]:
    status, what = estop(target, "robotctl watch", timeout_s)
    if status == "ok":
        return True, humane.result("estop", what).replace("\n", "; ")
    return False, printable(what if status == "unreachable" else f"{what[0]}: {what[1]}")


def _estop_command(target: Target, args: argparse.Namespace, out: Output) -> int:
    status, what = estop(target, args.reason, args.timeout)
    if status == "ok":
        return out.result("estop", what)
    if status == "error" and what[0] != NOT_WRITTEN:
        return out.error("estop", what[0], what[1], EXIT_ERROR)
    if status == "error":  # latched, not written: as unconfirmed as no answer at all
        return out.error("estop", what[0], what[1], EXIT_UNREACHABLE)
    return out.error("estop", "unreachable", what, EXIT_UNREACHABLE)


def _lane_silent(command: str, result: Any) -> bool:
    """status and stats answered, but the daemon says the control lane has gone silent:
    what they show is its last word, not live, so they do not exit 0."""
    silent = isinstance(result, dict) and result.get("lane_silent") is True
    return silent and command in ("status", "stats")


def _keygen(args: argparse.Namespace, out: Output) -> int:
    kind = key_kind(args.name, args.kind)
    directory = args.dir or default_key_file().parent
    public, secret = keygen(directory, args.name)
    default = secret.resolve() == default_key_file().resolve()
    made = {"public": str(public), "secret": str(secret), "kind": kind}
    return out.result("keygen", {**made, "default": default} if kind == "client" else made)


def _locate(args: argparse.Namespace, out: Output) -> Target:
    check_endpoint(args.endpoint or os.environ.get("ROBOTD_ENDPOINT") or None, "--endpoint")
    check_endpoint(args.telemetry, "--telemetry")
    return locate_for(
        args.command, args.endpoint, args.telemetry, args.config, args.server_key, args.key,
        warn=out.warn,
    )  # fmt: skip


def _run(args: argparse.Namespace, out: Output) -> int:
    if args.command == "keygen":
        return _keygen(args, out)
    target = _locate(args, out)
    if args.command == "watch":
        from robotd.operator.watch import watch

        return watch(
            target,
            lambda: _watch_estop(target, args.timeout),
            seconds=args.seconds,
            as_json=args.json,
        )
    if args.command == "estop":
        return _estop_command(target, args, out)
    request = _request_args(args)
    try:
        reply = request_once(
            target.control, args.command, request, timeout_s=args.timeout, curve=target.curve
        )
    except Unreachable as exc:
        said = str(exc)
        # refused once past our wait (expired); over tcp the daemon counts the wait from when
        # it read the request, so a main process stopped meanwhile may still carry it out
        local = target.control.startswith("ipc://")
        if exc.sent and local and args.command in UNDO_ESTOP:
            said += (
                f"; the {args.command} is not carried out if it reaches the control lane "
                "from now on, but may have just now: check robotctl status"
            )
        elif exc.sent and (args.command in ACTING or "set" in request):
            said += f"; the {args.command} may still take effect: check robotctl status"
        return out.error(args.command, "unreachable", said, EXIT_UNREACHABLE)
    if reply.get("ok"):
        code = out.result(args.command, reply.get("result"))
        return EXIT_ERROR if _lane_silent(args.command, reply.get("result")) else code
    err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    code, message = str(err.get("code", "error")), str(err.get("message", ""))
    return out.error(args.command, code, message, EXIT_ERROR)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `… | head`: the reader has what it wanted
        return reader_gone()


def _main(argv: list[str] | None = None) -> int:
    out = Output(False)
    try:
        args = _parser().parse_args(argv)
        out = Output(bool(getattr(args, "json", False)))
        return _run(args, out)
    except (ConfigError, KeyFileError) as exc:
        return out.error("config", "config", str(exc), EXIT_CONFIG)
    except ValueError as exc:  # UsageError, LocateError and bad KEY=VALUE arguments
        return out.error("usage", "usage", str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `robotctl status | head`: the reader left; say nothing more, anywhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
