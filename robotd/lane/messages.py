"""Every message between the main process and the control process, typed once.

Down (main → control, on the lane's private socket): `ChunkRows` (the rows of a chunk
that answers an ask), `Command` (an operator command, already validated and bounded),
`ActFailed`, `EpisodeLost`, `Contract`, `Beat`, `Shutdown`. The e-stop socket (lane.sock, open
to the robot's group) takes `Estop` and nothing else.

Up (control → main): `Step` (one per control tick: the observation made and, filled in at
the end of the tick, what was done with it), `Ask`, `Merged` (the report of a chunk
merged into the queue), `StartState` (what the kernel held when an episode started: what a
replay of the episode starts from), `Stats`, `Status`, `Reply`, `Event`, `Ready`, `Bye`.

Each is a msgspec Struct tagged by its field "k"; robotd.lane.codec encodes and decodes
them (msgpack on the wire), and decoding validates every field against these types and
bounds, so a malformed message is refused with a reason and never reaches the loop.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import numpy as np

from robotd.control.counters import Counters, QueueCounters, ShieldCounters
from robotd.control.histogram import HistogramData

MAX_JOINTS = 64
MAX_ROWS = 4096  # the lane's own bound; the link refuses far less (policy.max_chunk_rows)
MAX_CAMERAS = 32
MAX_TEXT = 500
MAX_TASK = 2000
MAX_ID = 256
MAX_DETAIL = 32

Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
Ident = Annotated[str, msgspec.Meta(max_length=MAX_ID)]
Step_ = Annotated[int, msgspec.Meta(ge=0)]
Vector = Annotated[list[float], msgspec.Meta(max_length=MAX_JOINTS)]
FrameRef = tuple[int, int]  # (frame index in the camera's ring, capture time ns)
Scalar = str | int | float | bool | None


class _Msg(msgspec.Struct, tag_field="k", forbid_unknown_fields=True):
    """Base of every lane message (the tag field "k" names its kind)."""


# ---- arrays ------------------------------------------------------------------------------


class Rows(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A (n, dim) float64 array as raw little-endian bytes (no per-element work)."""

    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_ROWS)]
    dim: Annotated[int, msgspec.Meta(ge=1, le=MAX_JOINTS)]
    data: bytes

    @classmethod
    def of(cls, rows: np.ndarray) -> Rows:
        """Rows of a 2-D array (copied to little-endian float64 C order)."""
        a = np.ascontiguousarray(rows, dtype="<f8")
        if a.ndim != 2:
            raise ValueError(f"Rows.of: need a 2-D array, got shape {a.shape}")
        return cls(int(a.shape[0]), int(a.shape[1]), a.tobytes())

    def array(self) -> np.ndarray:
        """The rows as a read-only (n, dim) float64 view; ValueError if the byte count is
        not n * dim * 8."""
        if len(self.data) != self.n * self.dim * 8:
            raise ValueError(
                f"rows: {len(self.data)} bytes for {self.n} x {self.dim} float64 "
                f"(need {self.n * self.dim * 8})"
            )
        return np.frombuffer(self.data, dtype="<f8").reshape(self.n, self.dim)


# ---- down: main → control ------------------------------------------------------------------


class ChunkRows(_Msg, tag="rows"):
    """The chunk answering ask `ask`: row i computed from step `s` of worker episode
    `wep` is meant for step s + i (already at the control rate)."""

    ask: int
    wep: Ident
    s: Step_
    rows: Rows


CommandName = Literal["status", "start", "stop", "estop", "clear_fault", "reset_done"]


# Commands that end a stop (the robot may move again after them): refused when taken before
# the latest e-stop, or reaching the lane after their client stopped waiting (expires_ns)
UNDO_ESTOP = frozenset({"clear_fault", "start", "reset_done"})


class Command(_Msg, tag="cmd"):
    """An operator command for the control lane; answered by a `Reply` with the same id."""

    id: int
    cmd: CommandName
    reason: Text = ""  # estop: why
    task: Annotated[str, msgspec.Meta(max_length=MAX_TASK)] = ""  # start: the task text
    # CLOCK_MONOTONIC (system-wide) when the operator's request was taken (0: unknown): a
    # command taken before an e-stop must not undo it, whichever socket reaches the lane first
    sent_ns: Annotated[int, msgspec.Meta(ge=0)] = 0
    # CLOCK_MONOTONIC after which its client no longer waits for the answer (0: none): a
    # command that would move the robot again is refused past it (`expired`)
    expires_ns: Annotated[int, msgspec.Meta(ge=0)] = 0


class ActFailed(_Msg, tag="act_failed"):
    """The act answering ask `ask` failed; the lane backs off before asking again."""

    ask: int
    reason: Text


class EpisodeLost(_Msg, tag="episode_lost"):
    """The worker's copy of the policy holding the episode is gone (or a new worker):
    the lane goes on in a new worker-side episode."""

    cause: Text


class Contract(_Msg, tag="contract"):
    """The action contract in force: sync plays at most `open_loop_horizon` rows of a
    chunk; `rtc`: the policy is handed each act's frozen prefix (Ask.rtc), so the merge
    keeps those rows as they are, whatever the answer holds for their steps. `ready`: the
    policy answers acts now; False while an openpi server's warm-up holds them (the same
    contract follows with True when it is over), so a robot that starts its own first
    episode (robot.start = "episode") starts it then, not into a wait longer than its
    patience."""

    open_loop_horizon: Annotated[int, msgspec.Meta(ge=1)] | None = None
    rtc: bool = False
    ready: bool = True


class Beat(_Msg, tag="beat"):
    """The main process is alive (sent every BEAT_S, robotd.runtime.bridge): a lane that
    hears nothing from it for control.main_silent_s holds and then e-stops."""


class Shutdown(_Msg, tag="stop"):
    """Stop the loop (the robot holds), send the last stats and `Bye`, exit."""


class Estop(_Msg, tag="estop"):
    """The only message lane.sock takes: latch the e-stop. Answered by a `Reply` with the
    same id."""

    id: int | None = None
    reason: Text = ""
    sent_ns: Annotated[int, msgspec.Meta(ge=0)] = 0  # as Command.sent_ns


DownMsg = ChunkRows | Command | ActFailed | EpisodeLost | Contract | Beat | Shutdown


# ---- up: control → main --------------------------------------------------------------------


class Step(_Msg, tag="step"):
    """Step `s` of worker episode `wep` (operator episode `ep`), made at tick time `t` (ns).

    The observation: joint positions and velocities, each camera's newest frame reference
    (None: no frame yet), `ok` False when a camera's frame was too old (no act is asked
    from it), `skipped` for a step an overrun or a failed read skipped (it repeats the
    last record), `gt` the simulator's ground truth. What was done: `target` written (None:
    nothing written), `held` (no row to play, or a rejected one), `shield` the shield's
    outcome ("" when the row passed untouched). `tick`: the kernel's tick count when the
    step was made (a gap between two steps' ticks is ticks whose joint read failed).
    """

    ep: int
    wep: Ident
    s: Step_
    t: int
    pos: Vector
    vel: Vector
    cams: Annotated[dict[str, FrameRef | None], msgspec.Meta(max_length=MAX_CAMERAS)]
    ok: bool
    skipped: bool = False
    gt: dict[str, float] | None = None
    target: Vector | None = None
    held: bool = False
    shield: Literal["", "clipped", "clamped", "rejected"] = ""
    tick: Annotated[int, msgspec.Meta(ge=0)] = 0


class Rtc(msgspec.Struct, forbid_unknown_fields=True):
    """Real-time chunking for one act asked at step s: `delay` d, the steps its answer is
    predicted to take (>= 1); `prefix`, the queued rows that will play at steps s, s+1, ...
    while it computes (at most d of them; fewer when fewer are queued; None: none); `rest`,
    the queued rows after them (the remainder of the chunk playing now, not frozen)."""

    delay: Annotated[int, msgspec.Meta(ge=1, le=MAX_ROWS)]
    prefix: Rows | None = None
    rest: Rows | None = None


class Ask(_Msg, tag="ask"):
    """Act `id`: a chunk computed from step `s`, asked with `queue` rows left; `rtc` (every
    realtime aligned act) the predicted delay and the frozen prefix."""

    id: int
    wep: Ident
    s: Step_
    ep: int
    queue: int
    rtc: Rtc | None = None


class Merged(_Msg, tag="merged"):
    """The chunk answering ask `ask` (computed from `from_step`) was merged at step `at`:
    `rows` rows, `dropped` of them already past, `stale` when all were. `refill`: realtime,
    the next act is asked when at most this many rows remain (the uplink's prediction)."""

    ask: int
    wep: Ident
    from_step: Step_
    at: Step_
    rows: int
    dropped: int
    stale: bool
    refill: Annotated[int, msgspec.Meta(ge=0)] = 0


class StartState(_Msg, tag="start_state"):
    """What the kernel held as operator episode `ep` started, emitted just before its
    `episode_start` event: with the config and the episode's recorded inputs, a replay
    (robotd.trace.replay) starts from here and must play the same targets.

    `tick` the kernel's tick count; `run_id` and `wep_n` name the worker-side episodes
    (`wep` is run_id-wep_n); the shield's anchor (`last`, None before any read) and last
    step (`last_step`) and its run of rejections (`rejections`); the playback's last ask
    id, the tick before which it may not ask (`retry_at`) and the contract's
    `open_loop_horizon` and whether the policy takes frozen prefixes (`rtc`); the delays
    of the recent acts the next delay is predicted from (`delays`, oldest first); the fault
    latch (`torque`, `anchored`); steps pending a skip (`skip`) and failed reads in a row
    (`read_failures`); the operator's `task`.
    """

    ep: int
    wep: Ident
    run_id: Ident
    wep_n: Annotated[int, msgspec.Meta(ge=0)]
    tick: Annotated[int, msgspec.Meta(ge=0)]
    last: Vector | None
    last_step: Vector | None
    rejections: Annotated[int, msgspec.Meta(ge=0)]
    ask_id: Annotated[int, msgspec.Meta(ge=0)]
    retry_at: int
    open_loop_horizon: Annotated[int, msgspec.Meta(ge=1)] | None
    torque: bool
    anchored: bool
    skip: Annotated[int, msgspec.Meta(ge=0)]
    read_failures: Annotated[int, msgspec.Meta(ge=0)]
    task: Annotated[str, msgspec.Meta(max_length=MAX_TASK)] = ""
    rtc: bool = False
    delays: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(max_length=256)] = []


class Fault(msgspec.Struct, forbid_unknown_fields=True):
    """The latched fault: the first cause and its detail (what stopped the robot); `active`
    while some cause is still present (`present` names one: it may be a later cause); the
    causes latched after the first only as their count (`later`) and the latest."""

    cause: Text
    detail: Text
    active: bool
    later: Annotated[int, msgspec.Meta(ge=0)] = 0
    latest_cause: Text = ""
    latest_detail: Text = ""
    present: Text = ""
    estop: bool = False  # an e-stop latched in it, first or later (watch's E-STOP tag)


class Status(_Msg, tag="state"):
    """The lane's state: sent with every reply and with the stats."""

    state: Literal["IDLE", "RUNNING", "ENDED", "RESETTING", "FAULT"]
    episode: int
    wep: Ident
    step: int
    outcome: Text
    fault: Fault | None
    queue: int
    in_flight: bool
    torque: bool
    task: Annotated[str, msgspec.Meta(max_length=MAX_TASK)] = ""
    # while RUNNING: the cameras whose newest frame was missing or older than max_age_ms at
    # the last step (no act is asked from such a step: why the robot holds, said)
    stale_cameras: Annotated[tuple[Ident, ...], msgspec.Meta(max_length=MAX_CAMERAS)] = ()
    # a category-1 e-stop's controlled stop under way: seconds before torque goes off (an
    # e-stop's answer shows torque still on; this says it is going off, and when)
    stopping_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    # the lane's count of the states it has said: the newest is the one to show, since the
    # up stream and lane.sock's e-stop answers are not ordered between them
    seq: Annotated[int, msgspec.Meta(ge=0)] = 0
    # the step within the worker-side episode `wep`: what the policy's windows and chunks
    # count by (it starts again when a lost copy resets the episode on the worker)
    wstep: Annotated[int, msgspec.Meta(ge=0)] = 0


class Stats(_Msg, tag="stats"):
    """Every counter of the run so far (cumulative), sent every stats interval."""

    counters: Counters
    queue: QueueCounters
    shield: ShieldCounters
    lateness: HistogramData
    wake_lateness: HistogramData
    ask_steps: dict[int, int]
    ask_ns: HistogramData
    missed_ticks: int
    overruns: int
    elapsed_s: float
    dropped_messages: int
    driver: dict[str, dict[str, int]]
    state: Status

    def totals(self) -> dict[str, int]:
        """Every count under the name the summary and telemetry give it."""
        q, sh = self.queue, self.shield
        return {
            **msgspec.structs.asdict(self.counters),
            "stale_chunks": q.stale_chunks,
            # every row given up because its step had passed: at merge (the latency drop,
            # stale chunks whole) and at pop
            "rows_dropped": q.rows_dropped + q.merge_dropped,
            "merge_dropped": q.merge_dropped,
            "flushed_rows": q.flushed_rows,
            "interventions": sh.interventions,
            "clipped": sh.clipped,
            "clamped": sh.clamped,
            "rejected": sh.rejected,
            "missed_ticks": self.missed_ticks,
            "overruns": self.overruns,
            "dropped_messages": self.dropped_messages,
        }


# Reply.code of an e-stop that latched but whose safe command the driver failed to write
NOT_WRITTEN = "not_written"


class Reply(_Msg, tag="reply"):
    """The answer to the `Command` or `Estop` of id `id`. An e-stop is answered once the
    tick that applied it has written its safe command: `written_ns` says when (monotonic);
    ok false with code NOT_WRITTEN when the write failed (the e-stop is latched all the
    same, the robot maybe not stopped)."""

    id: int | None
    ok: bool
    status: Status | None = None
    code: Text = ""
    message: Text = ""
    written_ns: int | None = None


class Event(_Msg, tag="event"):
    """Something happened at tick `tick`: `name` with a few scalar details."""

    name: Annotated[str, msgspec.Meta(max_length=64)]
    tick: int
    detail: Annotated[dict[str, Scalar], msgspec.Meta(max_length=MAX_DETAIL)] = {}


class Ready(_Msg, tag="ready"):
    """The loop ticks (sent after its first tick), with the realtime set-up's warnings."""

    pid: int
    warnings: list[Text] = []


class Bye(_Msg, tag="bye"):
    """The loop stopped; nothing more comes."""


UpMsg = Step | Ask | Merged | StartState | Stats | Status | Reply | Event | Ready | Bye
