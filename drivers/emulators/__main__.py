"""python -m drivers.emulators {dynamixel|feetech} [--ids 1,2,3,4,5,6] [--baud 1000000]
[--model NAME[,NAME...]] [--fault ID:KIND[:COUNT] | --fault echo]...

Prints the pty path as its first line, then serves until killed (SIGTERM, SIGINT)."""

from __future__ import annotations

import argparse
import signal
import sys

from drivers.emulators.bus import PROTOCOLS, Emulator
from drivers.emulators.faults import parse_fault
from robotd.runtime.procutil import signal_event


def _ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ids {text!r}: comma-separated numbers") from None
    if not ids or len(set(ids)) != len(ids) or any(not 0 <= i <= 252 for i in ids):
        raise argparse.ArgumentTypeError(f"--ids {text!r}: distinct IDs 0..252")
    return ids


def _fault(text: str):
    try:
        return parse_fault(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m drivers.emulators", description=__doc__)
    p.add_argument("protocol", choices=PROTOCOLS)
    p.add_argument("--ids", type=_ids, default=[1, 2, 3, 4, 5, 6])
    p.add_argument("--baud", type=int, default=1_000_000, help="wire timing; 0: answer at once")
    p.add_argument(
        "--model",
        type=lambda text: text.split(","),
        default=None,
        help="e.g. xl330-m288, xl430-w250, sts3215; or one per ID, comma-separated",
    )
    p.add_argument("--fault", dest="faults", type=_fault, action="append", default=[])
    args = p.parse_args(argv)
    if args.baud < 0:
        p.error("--baud must be >= 0")
    from robotd.runtime.procutil import die_with_parent

    die_with_parent()
    try:
        emulator = Emulator(
            args.protocol, args.ids, baud=args.baud, model=args.model, faults=args.faults
        )
    except ValueError as exc:
        p.error(str(exc))
    # set by a pipe and a thread, not by the handler: a second signal landing inside the
    # first handler's Event.set would deadlock (robotd.runtime.procutil.signal_event)
    done = signal_event((signal.SIGTERM, signal.SIGINT))
    print(emulator.port, flush=True)
    emulator.start()
    done.wait()
    emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
