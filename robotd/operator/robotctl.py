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

This module runs a parsed command and prints its outcome; the grammar, the exit codes and
the argument checks are robotd.operator.robotctl_args', the e-stop's two paths
robotd.operator.robotctl_estop's, the live view robotd.operator.watch's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from robotd.errors import ConfigError
from robotd.lane.messages import NOT_WRITTEN, UNDO_ESTOP
from robotd.operator import humane
from robotd.operator.client import ControlClient, Unreachable, request_once
from robotd.operator.curve import KeyFileError, key_kind, keygen
from robotd.operator.locate import Target, default_key_file, locate_for
from robotd.operator.robotctl_args import (
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    check_endpoint,
    parser,
    request_args,
)
from robotd.operator.robotctl_estop import estop
from robotd.operator.words import printable
from robotd.pipes import reader_gone

__all__ = ["ControlClient", "main"]  # ControlClient: what scripts and tests drive robotd by

# Commands that change something: without a reply in time they may still be carried out.
ACTING = frozenset({"start", "stop", "clear_fault", "reset_done", "verdict"})


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
    request = request_args(args)
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
        args = parser().parse_args(argv)
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
