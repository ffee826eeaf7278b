"""``robotd replay EPISODE.mcap [--json]``: run a recorded episode again through the tick
code the robot runs, and check that it plays the same targets, bit for bit.

A fresh `Kernel` is built from the run's config snapshot (``run.json`` beside the episode)
and put into the state the trace recorded at the episode's start (robotd.control.resume).
`TickIO` then drives it tick by tick, as the control lane does, with a replay driver that
returns each tick's recorded joint state (a tick without a record is one whose read failed)
and a frames provider returning the recorded frame references. Between ticks the recorded
inputs go in where they came: chunks before the tick that merged them (or, answered at
once on the virtual clock, from the ask itself), act failures, worker-side resets and
contracts after the tick they followed, an operator's stop or e-stop at the tick it ended
the episode. Every step the replay makes is compared with the recorded one (step, worker
episode, target, hold, shield); asks and merges are compared too.

Exit 0: every played target matches; 1: the first step that differs, and what differed;
2: the trace cannot be replayed (decimated, records lost, no start state), saying why.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from drivers.base import DriverFault, JointState
from robotd.control import resume
from robotd.control.episode import State
from robotd.control.kernel import Kernel
from robotd.control.playback import Chunk
from robotd.control.tick import TickIO
from robotd.lane.messages import Ask, Event, Merged, Step
from robotd.trace.replay_input import ChunkRecord, Recorded, ReplayError, TickRecord, load
from robotd.trace.replay_input import same_bits as _same

KERNEL_ENDS = frozenset({"safety", "driver"})  # fault causes the kernel finds by itself


class ReplayDriver:
    """The joint driver of a replay: each tick's recorded joint state (`now`), or a failed
    read when the tick has none; writes are kept (`written`), torque is a no-op."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.now: TickRecord | None = None
        self.written: np.ndarray | None = None

    def read(self) -> JointState:
        if self.now is None:
            raise DriverFault("the recorded read of this tick failed")
        r = self.now
        return JointState(r.pos.copy(), r.vel.copy(), np.zeros(self.dim), r.t_ns)

    def write(self, targets: np.ndarray) -> None:
        self.written = np.array(targets, dtype=np.float64)

    def torque(self, on: bool) -> None:
        pass

    def ground_truth(self) -> dict[str, float]:
        return {}


@dataclass
class Difference:
    what: str
    step: int | None = None
    tick: int | None = None
    wep: str = ""
    recorded: Any = None
    replayed: Any = None

    def text(self) -> str:
        where = f"step {self.step} (tick {self.tick}, worker episode {self.wep})" \
            if self.step is not None else f"tick {self.tick}"
        return f"{where}: {self.what}: recorded {self.recorded}, replayed {self.replayed}"


@dataclass
class Outcome:
    """What a replay found. `targets`: the recorded steps that played a target; `matched`:
    those the replay played bit for bit the same (up to the first difference)."""

    file: str
    ticks: int = 0
    steps: int = 0
    targets: int = 0
    matched: int = 0
    asks: int = 0
    chunks: int = 0
    resets: int = 0
    end: dict[str, Any] | None = None
    difference: Difference | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def match(self) -> bool:
        return self.difference is None

    def to_dict(self) -> dict[str, Any]:
        d = self.difference
        return {"file": self.file, "match": self.match, "ticks": self.ticks,
                "steps": self.steps, "targets": self.targets, "matched": self.matched,
                "asks": self.asks, "chunks": self.chunks, "resets": self.resets,
                "end": self.end, "notes": self.notes,
                "first_difference": None if d is None else {**d.__dict__, "text": d.text()}}


class Replay:
    """One recorded episode run again (see the module docstring); `run()` → Outcome."""

    def __init__(self, rec: Recorded) -> None:
        self.rec = rec
        cfg = rec.config
        self.out: list[Any] = []
        self.kernel = Kernel(cfg, run_id=rec.start.run_id, emit=self.out.append,
                             asker=self._asker)
        try:
            resume.restore(self.kernel, rec.start)
        except ValueError as exc:
            raise ReplayError(f"{rec.path}: {exc}") from None
        self.driver = ReplayDriver(len(cfg.joints.names))
        self._cams: dict[str, tuple[int, int] | None] = {}
        self._ended: Event | None = None  # the replay's own episode_end
        self.errors: list[str] = []
        self.io = TickIO(self.kernel, self.driver, lambda: self._cams, self._error)  # type: ignore[arg-type]
        self.io.start()
        self.result = Outcome(str(rec.path), notes=list(rec.notes),
                              targets=sum(t.target is not None for t in rec.ticks))
        real = {(t.wep, t.s): t.tick for t in rec.ticks if not t.skipped}
        ask_tick = {a["id"]: real.get((a["wep"], a["s"])) for a in rec.asks}
        self._at_once: dict[int, ChunkRecord] = {}  # answered within the ask's own tick
        self._due: dict[int, list[ChunkRecord]] = {}  # delivered before this tick
        for c in rec.chunks.values():
            tick = c.tick if c.result == "bad" else real.get((c.wep, c.at))
            if tick is None:
                self.result.notes.append(f"chunk of ask {c.ask}: the step it merged at is "
                                         "not in the trace; not replayed")
            elif tick == ask_tick.get(c.ask):
                self._at_once[c.ask] = c
            else:
                self._due.setdefault(tick, []).append(c)

    def _error(self, op: str, exc: BaseException) -> None:
        if op != "read":
            self.errors.append(f"{op}: {type(exc).__name__}: {exc}")

    def _asker(self, ask: Ask) -> Chunk | None:
        c = self._at_once.pop(ask.id, None)
        return None if c is None else _chunk(c)

    # ---- the run ---------------------------------------------------------------------------

    def run(self) -> Outcome:
        rec, k = self.rec, self.kernel
        by_tick: dict[int, list[TickRecord]] = {}
        for t in rec.ticks:
            by_tick.setdefault(t.tick, []).append(t)
        last = max([*by_tick, rec.end["tick"] if rec.end else rec.start.tick])
        expected = iter(rec.ticks)
        for tick in range(rec.start.tick + 1, last + 1):
            if k.machine.state is not State.RUNNING:
                self._differ(Difference("the episode ended early", tick=tick,
                                        recorded=f"ticks up to {last}",
                                        replayed=f"{k.machine.outcome} at tick {tick - 1}"))
                break
            for c in self._due.pop(tick, []):
                k.deliver(_chunk(c))
            self._tick(tick, by_tick.get(tick, []))
            if not self._compare(expected) or not self._between(tick):
                break
            self.result.ticks += 1
        left = next(expected, None)
        if self.result.match and left is not None:
            self._differ(Difference("a recorded step the replay did not make", step=left.s,
                                    tick=left.tick, wep=left.wep, recorded="made",
                                    replayed="not made"))
        if self.result.match:
            self._check_end()
        return self.result

    def _tick(self, tick: int, records: list[TickRecord]) -> None:
        k, real = self.kernel, [r for r in records if not r.skipped]
        skipped = 0
        if real:
            self.driver.now = now = real[0]
            skipped = now.s - k.step - k._skip
        elif records:  # skipped steps alone: the read was fine, max_steps came while skipping
            self.driver.now = now = records[-1]
            skipped = records[-1].s + 1 - k.step - k._skip
        else:
            self.driver.now = None  # no record: the read of this tick failed
            now = None
        if now is not None:
            self._cams = now.cams
        self.io.run(now.t_ns if now is not None else 0, max(0, skipped))

    def _compare(self, expected: Any) -> bool:
        """The steps, asks and merges this tick made against the recorded ones."""
        res = self.result
        for msg in self.out:
            if isinstance(msg, Step):
                r = next(expected, None)
                d = _step_difference(msg, r)
                if d is not None:
                    return self._differ(d)
                res.steps += 1
                if r is not None and r.target is not None:
                    res.matched += 1
            elif isinstance(msg, Ask):
                if not self._ask(msg):
                    return False
            elif isinstance(msg, Merged):
                if not self._merged(msg):
                    return False
            elif isinstance(msg, Event) and msg.name == "episode_end":
                self._ended = msg
        return True

    def _ask(self, msg: Ask) -> bool:
        asks, i = self.rec.asks, self.result.asks
        rtc = msg.rtc
        got = {"id": msg.id, "wep": msg.wep, "s": msg.s, "queue": msg.queue,
               "delay": rtc.delay if rtc is not None else 0,
               "frozen": rtc.prefix.n if rtc is not None and rtc.prefix is not None else 0}
        want = asks[i] if i < len(asks) else None
        self.result.asks += 1
        if want != got:
            return self._differ(Difference("ask", step=msg.s, tick=self.kernel.counters.ticks,
                                           wep=msg.wep, recorded=want, replayed=got))
        return True

    def _merged(self, msg: Merged) -> bool:
        c = self.rec.chunks.get(msg.ask)
        got = {"at": msg.at, "dropped": msg.dropped, "stale": msg.stale}
        want = None if c is None else {"at": c.at, "dropped": c.dropped,
                                       "stale": c.result == "stale"}
        self.result.chunks += 1
        if want != got:
            return self._differ(Difference(f"chunk of ask {msg.ask}", step=msg.at,
                                           tick=self.kernel.counters.ticks, wep=msg.wep,
                                           recorded=want, replayed=got))
        return True

    def _between(self, tick: int) -> bool:
        """The inputs recorded after `tick`, and an operator's end of the episode there."""
        self.out.clear()
        k = self.kernel
        for name, detail in self.rec.inputs.get(tick, []):
            if name == "act_failed" and type(detail.get("ask")) is int:
                k.act_failed(detail["ask"], str(detail.get("reason", "")))
            elif name == "episode_reset":
                k.episode_lost(str(detail.get("cause", "")))
            elif name == "contract":
                h = detail.get("open_loop_horizon")
                horizon = h if type(h) is int and h >= 1 else None
                k.set_contract(horizon, detail.get("rtc") is True, detail.get("ready") is not False)
        end = self.rec.end
        if end is not None and end["tick"] == tick and k.machine.state is State.RUNNING:
            if end["outcome"] == "stopped":
                k.command("stop")
            elif end["outcome"] == "fault" and end["cause"] not in KERNEL_ENDS:
                k.fault(end["cause"] or "operator", "replayed")
        ok = True
        for msg in self.out:
            if isinstance(msg, Event) and msg.name == "episode_reset":
                self.result.resets += 1
            elif isinstance(msg, Event) and msg.name == "episode_end":
                self._ended = msg
            elif isinstance(msg, Step | Ask | Merged):  # none come between ticks
                ok = self._differ(Difference(f"a {type(msg).__name__} between ticks",
                                             tick=tick, replayed=str(msg)[:200]))
        self.out.clear()
        return ok

    def _differ(self, d: Difference) -> bool:
        if self.result.difference is None:
            self.result.difference = d
        return False

    def _check_end(self) -> None:
        end, res, k = self.rec.end, self.result, self.kernel
        if end is None:
            res.notes.append("the episode's end was not recorded (the daemon stopped or "
                             "died first): compared up to its last record")
            return
        mine = self._ended
        got = None if mine is None else {"tick": mine.tick,
                                         "outcome": str(mine.detail.get("outcome")),
                                         "cause": str(mine.detail.get("cause") or "")}
        res.end = got
        if got != end:
            self._differ(Difference("the episode's end", tick=end["tick"], recorded=end,
                                    replayed=got or f"still {k.machine.state}"))
        res.notes.extend(self.errors[:5])


def _chunk(c: ChunkRecord) -> Chunk:
    return Chunk(c.ask, c.wep, c.from_step, c.rows.copy())


def _step_difference(got: Step, want: TickRecord | None) -> Difference | None:
    if want is None:
        return Difference("a step the trace does not have", step=got.s, tick=got.tick,
                          wep=got.wep, recorded=None, replayed={"s": got.s, "wep": got.wep})
    for name, a, b in (("worker episode", want.wep, got.wep), ("step", want.s, got.s),
                       ("tick", want.tick, got.tick), ("skipped", want.skipped, got.skipped),
                       ("observation valid", want.ok, got.ok), ("held", want.held, got.held),
                       ("shield", want.shield, got.shield)):
        if a != b:
            return Difference(name, step=want.s, tick=want.tick, wep=want.wep,
                              recorded=a, replayed=b)
    if not _same(want.target, got.target):
        return Difference("target", step=want.s, tick=want.tick, wep=want.wep,
                          recorded=want.target, replayed=got.target)
    return None


def replay(path: Path | str) -> Outcome:
    """Replay one episode file; ReplayError when it cannot be replayed."""
    return Replay(load(path)).run()


def _print(o: Outcome) -> None:
    print(f"replay {o.file}: {o.ticks} ticks, {o.steps} steps, {o.asks} asks, "
          f"{o.chunks} chunks merged, {o.resets} worker-side resets")
    for note in o.notes:
        print(f"  note: {note}")
    if o.match:
        end = f"; ended {o.end['outcome']} at tick {o.end['tick']}, as recorded" if o.end else ""
        print(f"OK: {o.matched} of {o.targets} played targets match, bit for bit{end}")
    else:
        assert o.difference is not None
        print(f"DIFFERS at {o.difference.text()}")
        print(f"  ({o.matched} of {o.targets} played targets matched before it)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="robotd replay", description=__doc__.splitlines()[0])
    p.add_argument("episode", type=Path, help="an episode's .mcap file (in its run directory)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    args = p.parse_args(argv)
    try:
        outcome = replay(args.episode)
    except ReplayError as exc:
        if args.json:
            print(json.dumps({"file": str(args.episode), "match": None, "error": str(exc)}))
        print(f"robotd replay: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(outcome.to_dict(), default=str))
    else:
        _print(outcome)
    return 0 if outcome.match else 1
