"""`robotd run | serve | check | trace | replay | export | calibrate`: the daemon, the
reference policy worker, a config check, looking at traces, replaying them, exporting them
as datasets, calibrating a servo arm."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from robotd.config import DEFAULT_CONFIG, Config, Loaded, _parse_value, load
from robotd.config.policy import HANG_MIN_S, hang_floor_problem
from robotd.errors import ConfigError
from robotd.pipes import reader_gone


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robotd", description="On-robot realtime control daemon.")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the daemon on a robot config")
    run.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="robot config (TOML)")
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key by its dotted path (value in TOML syntax)",
    )
    run.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    run.add_argument("--summary", type=Path, default=None, help="write the run's summary JSON here")
    run.add_argument("--worker", default=None, help="endpoint of a remote policy worker")
    run.add_argument("--no-status", action="store_true", help="no live status line")
    run.add_argument("--emulate", action="store_true", help="a servo arm on its bus emulator")
    run.add_argument(
        "--foxglove",
        type=int,
        nargs="?",
        const=8765,
        default=None,
        metavar="PORT",
        help="serve the trace's channels live to the Foxglove app (default port 8765)",
    )
    run.add_argument(
        "--foxglove-host",
        default="127.0.0.1",
        help="address of the live view (the loopback unless told otherwise; prefer an ssh "
        "tunnel to binding beyond it)",
    )
    run.add_argument("-v", "--verbose", action="store_true")

    _serve_parser(sub.add_parser("serve", help="serve a policy to robotd daemons"))

    unit = sub.add_parser("unit", help="print the systemd unit for this installation")
    unit.add_argument("--prefix", type=Path, default=None, help="where robotd is installed")
    unit.add_argument("--config", default="/etc/robotd/robot.toml", help="the robot's config")
    unit.add_argument(
        "--allow-missing",
        action="store_true",
        help="print it even when PREFIX/bin/robotd is not an executable file (yet)",
    )

    _check_parser(sub.add_parser("check", help="validate a robot config and print it resolved"))

    # listed for --help; main() hands their arguments to robotd.trace.cli before parsing
    for name, text in (
        ("trace", "look at traces: trace ls [DIR] | trace show EPISODE.mcap"),
        ("export", "export traces: export RUN_OR_EPISODES --lerobot DIR"),
        ("replay", "replay an episode through the tick code: replay EPISODE.mcap [--json]"),
        ("calibrate", "calibrate a servo arm: calibrate --config CONFIG"),
    ):
        sub.add_parser(name, help=text, add_help=False).add_argument("rest", nargs="...")
    return p


def _check_parser(check: argparse.ArgumentParser) -> None:
    """`robotd check`'s options: the config's, and the read-only probe's."""
    check.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    check.add_argument(
        "--probe",
        action="store_true",
        help="servo arms (dynamixel, feetech): after the config checks, open the port and "
        "READ ONLY (never a register written, never torque on; stop a running daemon "
        "first) ping each joint's servo ID, read its model and its position against the "
        "calibrated range; a silent ID has the bus scanned for the IDs that answer",
    )
    check.add_argument(
        "--no-scan", action="store_true", help="with --probe: do not scan the bus for IDs"
    )
    check.add_argument(
        "--json", action="store_true", help="with --probe: one JSON object on the last line"
    )


def _serve_parser(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("policy", help="MODULE:CLASS of the policy")
    serve.add_argument(
        "--bind",
        required=True,
        help="act endpoint: ZeroMQ (tcp://0.0.0.0:5555, ipc://PATH) or a byte stream, "
        "lighter per act (stream+tcp://0.0.0.0:5555, stream+ipc://PATH)",
    )
    serve.add_argument(
        "--arg",
        dest="args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for the policy's constructor (value in TOML syntax)",
    )
    serve.add_argument(
        "--observe",
        default=None,
        help="endpoint for uploads (default: beside --bind: x.sock → x-o.sock, tcp port P → P+1)",
    )
    serve.add_argument(
        "--stream-wait-s",
        type=float,
        default=10.0,
        help="how long an act waits for steps not yet uploaded",
    )
    serve.add_argument("--max-episode-frames", type=int, default=1024)
    serve.add_argument("--max-episode-mib", type=int, default=64)
    serve.add_argument("--max-worker-mib", type=int, default=1024)
    _copies_arguments(serve)
    serve.add_argument("--args-json", default=None, help=argparse.SUPPRESS)


def _copies_arguments(serve: argparse.ArgumentParser) -> None:
    """How `robotd serve` runs the policy: copies, inline, hang and start limits."""
    serve.add_argument(
        "--copies",
        type=int,
        default=None,
        help="copies of the policy, each in its own process (idle ones are warm spares; "
        "default 1); 0: one copy in a thread of the worker, without isolation",
    )
    serve.add_argument(
        "--inline",
        action="store_true",
        help="run the policy in the worker's poll loop, as openpi's server does: the "
        "shortest act round trip, but nothing isolated or watched (no hang detection; "
        "pings wait while the policy computes)",
    )
    serve.add_argument(
        "--hang-s",
        type=_hang_seconds,
        default=5.0,
        help="a call into a copy unanswered this long is a hang: the copy is killed and "
        f"its episode lost (at least {HANG_MIN_S:g} s; keep it below the robot's patience)",
    )
    serve.add_argument(
        "--first-call-s",
        type=_hang_seconds,
        default=60.0,
        help="a copy's first call (its policy's warm-up: JIT compilation, CUDA kernels) is a "
        "hang only past this, when longer than --hang-s",
    )
    serve.add_argument(
        "--start-s", type=float, default=120.0, help="a copy not ready this long is given up"
    )
    serve.add_argument(
        "--copy-memory-mib",
        type=int,
        default=0,
        help="address-space limit of each copy process (RLIMIT_AS; 0: none)",
    )


def _hang_seconds(text: str) -> float:
    """--hang-s: seconds, finite and at least the floor the config's policy.hang_s has (the
    same rule, the same words), refused as argparse refuses a bad value."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text!r}")
    problem = hang_floor_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def _policy_kwargs(args: argparse.Namespace) -> dict:
    kwargs = json.loads(args.args_json) if args.args_json else {}
    for item in args.args:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"robotd serve: --arg {item!r}: expected KEY=VALUE")
        try:
            kwargs[key] = _parse_value(value)
        except ConfigError as exc:
            raise SystemExit(f"robotd serve: --arg {key}: {exc}") from None
    return kwargs


def _print_unit(args: argparse.Namespace) -> int:
    from robotd.runtime.unit import exec_start_problem, render_unit

    problem = None if args.allow_missing else exec_start_problem(args.prefix)
    if problem is not None:  # systemd would say so only when the service starts
        print(
            f"robotd unit: ExecStart: {problem}; no unit written (--allow-missing writes "
            "one for an installation made later or on another machine)",
            file=sys.stderr,
        )
        return 2
    print(render_unit(args.prefix, config=args.config), end="")
    return 0


def _check(args: argparse.Namespace, loaded: Loaded) -> int:
    """`robotd check`, with --probe's options only beside --probe."""
    from robotd.check import Probe, check

    if (args.no_scan or args.json) and not args.probe:
        print("robotd: check: --no-scan and --json go with --probe", file=sys.stderr)
        return 2
    probe = Probe(scan=not args.no_scan, as_json=args.json) if args.probe else None
    return check(loaded, probe)


def _load_checked(args: argparse.Namespace) -> Loaded:
    """The config (with what its load knew), with what start-up needs before anything
    moves: tcp endpoints only with usable CURVE keys."""
    from robotd.operator.endpoints import check_operator

    loaded = load(args.config, args.overrides)
    check_operator(loaded.config, str(args.config))
    return loaded


def _serve(args: argparse.Namespace) -> int:
    import zmq

    from robotd.runtime.daemon import setup_logging
    from robotd.runtime.procutil import PARENT_ENV, die_with_parent
    from robotd.worker.policy_host import PolicyLoadError
    from robotd.worker.server import CopyOptions, serve
    from robotd.worker.store import MB, StoreLimits

    # A local worker goes when its daemon goes; a remote one's parent is a shell or systemd.
    die_with_parent()
    if os.environ.get(PARENT_ENV):
        # A local worker is stopped by its daemon, after the daemon has closed its link to
        # it. A terminal's Ctrl-C reaches the whole process group: it is the daemon's to
        # act on, or the worker would vanish under a link still open.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging()
    try:
        limits = StoreLimits(
            episode_frames=args.max_episode_frames,
            episode_bytes=args.max_episode_mib * MB,
            worker_bytes=args.max_worker_mib * MB,
        )
        copies = CopyOptions(
            copies=(0 if args.inline else 1) if args.copies is None else args.copies,
            inline=args.inline,
            hang_s=args.hang_s,
            first_call_s=args.first_call_s,
            start_s=args.start_s,
            memory_bytes=args.copy_memory_mib * MB,
        )
    except ValueError as exc:
        print(f"robotd serve: {exc}", file=sys.stderr)
        return 2
    try:
        serve(
            args.policy,
            args.bind,
            policy_kwargs=_policy_kwargs(args),
            observe=args.observe,
            limits=limits,
            stream_wait_s=args.stream_wait_s,
            copies=copies,
        )
    except PolicyLoadError as exc:
        print(f"robotd serve: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, zmq.ZMQError) as exc:  # an endpoint that cannot be bound
        print(f"robotd serve: cannot serve on {args.bind}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: a clean stop
        return 0
    return 0


def _emulate(args: argparse.Namespace, cfg: Config) -> tuple[Config, Callable[[], None]] | None:
    """--emulate: the bus emulator started and the config pointed at it (None: said why)."""
    from robotd.runtime.emulate import start_emulation

    stop = None
    try:
        extra, stop = start_emulation(cfg)
        args.overrides = [*args.overrides, *extra]
        return _load_checked(args).config, stop
    except (ConfigError, RuntimeError) as exc:
        if stop is not None:
            stop()
        _say(exc)
        return None


def _say(exc: BaseException) -> None:
    """An error of one or more lines (a config's problems, each its own), every line led by
    `robotd: ` as the first: a grep or a journal filter for robotd finds them all."""
    for line in str(exc).splitlines() or [""]:
        print(f"robotd: {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `… | head`: the reader has what it wanted
        return reader_gone()


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["trace"], ["export"], ["replay"]):  # their own parsers (--help included)
        from robotd.trace import cli as trace_cli

        sub = {"trace": trace_cli.main, "export": trace_cli.export, "replay": trace_cli.replay}
        return sub[argv[0]](argv[1:])
    if argv[:1] == ["calibrate"]:
        from robotd.operator import calibrate

        return calibrate.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "unit":
        return _print_unit(args)
    try:
        loaded = _load_checked(args)
    except ConfigError as exc:
        _say(exc)
        return 2
    if args.command == "check":
        return _check(args, loaded)
    cfg = loaded.config
    if cfg.control.clock == "virtual":
        print(
            "robotd: control.clock: 'virtual' runs in one process without wall time "
            "(robotd.virtual.runner.run_virtual, bench/merge.py); the daemon runs on the "
            "wall clock",
            file=sys.stderr,
        )
        return 2
    stop_emulation = None
    if args.emulate:
        emulated = _emulate(args, cfg)
        if emulated is None:
            return 2
        cfg, stop_emulation = emulated
    from robotd.runtime import daemon

    daemon.setup_logging(args.verbose)
    opts = daemon.Options(
        duration=args.duration,
        summary=args.summary,
        worker=args.worker,
        status=not args.no_status,
        config_dir=Path(args.config).resolve().parent,
        foxglove=args.foxglove,
        foxglove_host=args.foxglove_host,
    )
    try:
        return daemon.run(cfg, opts)
    finally:
        if stop_emulation is not None:
            stop_emulation()
