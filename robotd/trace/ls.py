"""``robotd trace ls [DIR]``: the runs under a trace root and their episodes.

Each episode's outcome, verdict and length come from its sidecar JSON; an episode that
never ended (the daemon died) is read from its MCAP file instead, and said so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from robotd.trace.options import TraceOptions, trace_root
from robotd.trace.reader import TraceError, TraceReader
from robotd.trace.rundir import (
    RUN_JSON,
    RunEntry,
    episode_files,
    in_use,
    list_runs,
    read_json,
    tree_bytes,
)
from robotd.trace.schemas import CUT_OFF, TICK


def _scan_episode(path: Path) -> dict[str, Any]:
    """What a crashed episode's file holds: its start metadata, ticks and span."""
    reader = TraceReader(path)
    ticks, first, last = 0, None, None
    try:
        for msg in reader.messages([TICK]):
            ticks += 1
            first = msg.log_time if first is None else first
            last = msg.log_time
    except TraceError as exc:
        return {"file": path.name, "outcome": None, "note": str(exc)}
    span = (last - first) / 1e9 if first is not None and last is not None else 0.0
    end = reader.end or {"outcome": CUT_OFF}
    return {**reader.episode, **end, "file": path.name, "ticks": ticks,
            "duration_s": round(span, 6), "note": reader.status.message}


def _why(stopped: dict[str, Any]) -> str:
    return "disk full" if stopped.get("disk_full") else f"write error ({stopped.get('error')})"


def _stopped_note(stopped: Any) -> str:
    """The words for an episode file a write error closed (its sidecar's
    ``recording_stopped``): why, and how much of the episode the file holds."""
    if not isinstance(stopped, dict):
        return ""
    return (f"recording stopped: {_why(stopped)}: the file holds {stopped.get('recorded_ticks')}"
            f" ticks ({stopped.get('recorded_s')} s), {stopped.get('lost_ticks')} lost")


def episode_info(path: Path, recording: bool) -> dict[str, Any]:
    side = read_json(path.with_suffix(".json"))
    if side is not None and side.get("ended"):
        note = _stopped_note(side.get("recording_stopped"))
        return {**side, "file": path.name, **({"note": note} if note else {})}
    if recording:
        return {**(side or {}), "file": path.name, "outcome": "(recording)"}
    scanned = _scan_episode(path)
    stopped = (side or {}).get("recording_stopped")
    if note := _stopped_note(stopped):  # closed by a write error, then the daemon died
        scanned |= {"recording_stopped": stopped, "note": note}
    return scanned


def run_summary(run: RunEntry) -> dict[str, Any]:
    live = in_use(run.path)
    info = run.info
    episodes = [episode_info(p, live) for p in episode_files(run.path)]
    stopped = info.get("recording_stopped")
    if not isinstance(stopped, list):  # run.json never updated: the episodes may know
        stopped = [{"file": e.get("file"), **e["recording_stopped"]} for e in episodes
                   if isinstance(e.get("recording_stopped"), dict)]
    return {
        "run": run.name, "path": str(run.path), "started": info.get("started"),
        "ended": info.get("ended"), "host": info.get("host"), "robotd": info.get("robotd"),
        "in_use": live, "bytes": tree_bytes(run.path), "episodes": episodes,
        "recording_stopped": [s for s in stopped if isinstance(s, dict)],
    }


def _state(r: dict[str, Any]) -> str:
    """In use, ended (when), or did not close; and whether a write error stopped files."""
    if r["in_use"]:
        state = "in use"
    else:
        state = "ended " + str(r["ended"]) if r["ended"] else "did not close"
    if stopped := r.get("recording_stopped"):
        why = sorted({_why(s) for s in stopped})
        files = ", ".join(str(s.get("file")) for s in stopped)
        state += f"; recording stopped: {' / '.join(why)} ({files})"
    return state


def _verdict(v: Any) -> str:
    if not isinstance(v, dict):
        return "-"
    success = v.get("success")
    word = {True: "success", False: "failure"}[success] if isinstance(success, bool) else "-"
    notes = v.get("notes")
    return f"{word} ({notes})" if notes else word


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _print(runs: list[dict[str, Any]]) -> None:
    for r in runs:
        state = _state(r)
        print(f"{r['run']}  {r['host']!s}  started {r['started']!s}  {_mib(r['bytes'])}  {state}")
        for e in r["episodes"]:
            ticks, dur = e.get("ticks", "?"), e.get("duration_s", "?")
            dur = f"{dur:.1f}" if isinstance(dur, int | float) else dur  # JSON keeps it whole
            outcome = e.get("outcome") or "-"
            if e.get("cause"):
                outcome = f"{outcome}:{e['cause']}"
            line = (f"  episode {e.get('episode', '?')!s:>4}  {outcome!s:<14}"
                    f" {_verdict(e.get('verdict')):<20} {ticks!s:>6} ticks  {dur!s:>8} s")
            if e.get("task"):
                line += f"  {e['task']!r}"
            if e.get("note"):
                line += f"  [{e['note']}]"
            print(line)
        if not r["episodes"]:
            print("  (no episodes)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="robotd trace ls", description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, nargs="?", default=None,
                   help="trace root (default: $STATE_DIRECTORY/traces under systemd, else runs/)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    args = p.parse_args(argv)
    root = args.dir if args.dir is not None else trace_root(TraceOptions())
    if not root.is_dir():
        why = ("a file: ls lists a trace root or a run directory (robotd trace show FILE shows "
               "an episode)") if root.exists() else "no such directory"
        print(f"robotd trace ls: {root}: {why}", file=sys.stderr)
        return 2
    entries = list_runs(root)
    if not entries and (root / RUN_JSON).is_file():  # DIR is a run directory itself
        entries = [RunEntry(root, read_json(root / RUN_JSON) or {})]
    runs = [run_summary(r) for r in entries]
    if args.json:
        print(json.dumps({"root": str(root), "runs": runs}, default=str))
    elif not runs:
        print(f"{root}: no runs")
    else:
        _print(runs)
    return 0
