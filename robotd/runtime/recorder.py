"""What the robot did, onto the trace's channels (robotd.trace.schemas): the main process's
mapping of the control lane's messages, the chunks it sends down, operator commands and
link events to records of the trace store.

    Step → /robot/tick            Ask → /policy/ask          StartState → /robot/start_state
    ChunkRows sent + Merged (or the lane's bad_chunk / chunk_discarded) → /policy/chunk
    Event → /events (episode_start / episode_end open and close the episode's file)
    operator commands → /operator  uploads, refusals, reconnects, resets → /link
    camera frames → /camera/NAME: those the policy read (trace.frames = "policy"), or
      every frame each camera captured, out of its ring (= "all": robotd.runtime.camera_frames)

Every method returns at once: the store only queues (robotd.trace.store), so the event loop
never waits for the trace and the control lane never hears of it. The daemon feeds it from
its handlers (robotd.runtime.daemon); the virtual-clock runner feeds it the same messages
(robotd.virtual.runner), so both clocks write the same trace.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from robotd.config import Config
from robotd.lane.messages import Ask, ChunkRows, Event, Merged, StartState, Stats, Step
from robotd.runtime.camera_frames import CameraFrames, Ring
from robotd.trace.sanitize import sanitized
from robotd.trace.schemas import ASK, CHUNK, EVENTS, LANE_LOST, LINK, OPERATOR, START_STATE, TICK
from robotd.trace.start import open_store
from robotd.trace.store import EpisodeWriter, TraceStore

log = logging.getLogger("robotd.trace")

MAX_CHUNKS = 256  # chunks sent down and not yet reported on (an ask at a time: plenty)
MAX_STEPS = 2048  # recent steps' frame references, for the frames the uplink posts
MAX_FRAMES_SEEN = 512  # per camera: frame indices already recorded
QUIET_COMMANDS = frozenset({"status", "stats"})  # read-only and polled: not recorded
LOST_EVERY_NS = 1_000_000_000  # frames lost from a ring: one frames_lost event a second at most
FrameMode = Literal["policy", "all"]


class Recorder:
    """Maps what the main process sees onto `store` (see the module docstring).

    `clock` is the lane's clock (CLOCK_MONOTONIC on the wall clock, the virtual clock in a
    virtual run); log times are that clock plus `wall_offset_ns` (default: the offset to
    the Unix epoch now), so records line up with the ticks' own times.

    `frames` says which camera frames are recorded (when the store records frames at
    all): ``"policy"`` those the uplink posted or inlined, as they went; ``"all"`` every
    frame the cameras captured, read out of the rings given to `read_rings` (until then,
    none), and none of the policy's copies (one picture per frame index and topic: the
    camera's own, the training copy)."""

    def __init__(
        self,
        store: TraceStore,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        wall_offset_ns: int | None = None,
        frames: FrameMode = "policy",
    ) -> None:
        self.store = store
        self.frame_mode: FrameMode = frames
        self.cameras: CameraFrames | None = None  # "all": set by read_rings
        self._lost_noted = (0, 0)  # (lost frames recorded as an event, at log time)
        self.clock = clock
        self.offset = time.time_ns() - clock() if wall_offset_ns is None else wall_offset_ns
        self.episode: EpisodeWriter | None = None
        self._start: StartState | None = None
        # per ask, the chunks sent and not yet reported on, in the order the lane takes them
        self._sent: OrderedDict[int, deque[ChunkRows]] = OrderedDict()
        self._cams: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self._seen: dict[str, deque[int]] = {}
        self._lane_dropped = 0
        self.handlers: dict[type, Callable[[Any], None]] = {
            Step: self.on_step,
            Ask: self.on_ask,
            Merged: self.on_merged,
            StartState: self.on_start_state,
            Event: self.on_event,
            Stats: self.on_stats,
        }

    def now(self) -> int:
        return self.clock() + self.offset

    def feed(self, msg: Any) -> None:
        """Any message from the control lane (those the trace keeps nothing of are ignored)."""
        handler = self.handlers.get(type(msg))
        if handler is not None:
            handler(msg)

    # ---- the control lane ------------------------------------------------------------------

    def on_step(self, msg: Step) -> None:
        record = {
            "ep": msg.ep, "wep": msg.wep, "s": msg.s, "t_ns": msg.t, "tick": msg.tick,
            "pos": msg.pos, "vel": msg.vel, "cams": msg.cams, "target": msg.target,
            "held": msg.held, "shield": msg.shield, "ok": msg.ok, "skipped": msg.skipped,
        }
        self.store.write(TICK, msg.t + self.offset, record)
        if self.cameras is not None and self.episode is not None and self.store.frames_on:
            lost = self.cameras.on_step(self.episode, msg.cams, self.offset)
            if lost:
                self.store.frames_lost += lost
                self._note_lost(msg.t + self.offset)
        if self.frame_mode == "policy" and self.store.frames_on and not msg.skipped:
            self._cams[(msg.wep, msg.s)] = msg.cams
            if len(self._cams) > MAX_STEPS:
                self._cams.popitem(last=False)

    def on_ask(self, msg: Ask) -> None:
        rtc = msg.rtc
        prefix = rtc.prefix.n if rtc is not None and rtc.prefix is not None else 0
        record = {"id": msg.id, "wep": msg.wep, "s": msg.s, "queue": msg.queue,
                  "delay": rtc.delay if rtc is not None else 0, "frozen": prefix}
        self.store.write(ASK, self.now(), record)

    def on_start_state(self, msg: StartState) -> None:
        self._start = msg  # written into the episode its episode_start event opens

    def on_merged(self, msg: Merged) -> None:
        result = "stale" if msg.stale else "merged"
        self._chunk(msg.ask, msg.wep, msg.from_step, result, msg.at, msg.dropped, msg.stale)

    def on_stats(self, msg: Stats) -> None:
        """The lane's own drops (main's inbound queue was full) are recorded as they grow."""
        total = msg.dropped_messages
        if total > self._lane_dropped:
            detail = {"messages": total - self._lane_dropped, "total": total}
            self._lane_dropped = total
            self.store.write(EVENTS, self.now(), {"name": "lane_drop", "tick": None,
                                                  "detail": detail})

    def on_event(self, ev: Event) -> None:
        name, t = ev.name, self.now()
        if name == "episode_start":
            self._begin(ev, t)
            return
        if name == "episode_end":
            if self.episode is not None:
                self._note_lost(t, final=True)
                self.episode.end(str(ev.detail.get("outcome", "")), log_time_ns=t,
                                 tick=ev.tick, detail=dict(ev.detail))
                self.episode = None
            return
        self.store.write(EVENTS, t, {"name": name, "tick": ev.tick, "detail": ev.detail})
        if name == "episode_reset":
            self.link("episode_reset", {**ev.detail, "tick": ev.tick})
        elif name in ("bad_chunk", "chunk_discarded"):
            ask = ev.detail.get("ask")
            sent = self._sent.get(ask) if isinstance(ask, int) else None
            if sent:
                first = sent[0]
                result = "bad" if name == "bad_chunk" else "discarded"
                self._chunk(first.ask, first.wep, first.s, result, None, 0, False, ev.tick)

    def lane_lost(self, cause: str) -> None:
        """The control lane died: the episode it was running (if any) ends `lane_lost`
        with `cause`, now, rather than `daemon_stopped` at the store's close as if the
        daemon had stopped it. No tick: the lane never said where it ended."""
        if self.episode is None:
            return
        t = self.now()
        self._note_lost(t, final=True)
        self.episode.end(LANE_LOST, log_time_ns=t, detail={"cause": cause})
        self.episode = None

    def _begin(self, ev: Event, t: int) -> None:
        ep, wep = ev.detail.get("episode"), str(ev.detail.get("wep", ""))
        if not isinstance(ep, int) or not 0 <= ep < 10**9:
            log.error("trace: an episode_start without a usable episode number: %s", ev.detail)
            return
        start, self._start = self._start, None
        if start is not None and (start.ep != ep or start.wep != wep):
            start = None
        task = start.task if start is not None else None
        self.episode = self.store.begin_episode(ep, wep, task, log_time_ns=t, tick=ev.tick)
        if self.cameras is not None:
            self.cameras.reset()  # each file opens with the frame of its first tick
        if start is not None:
            self.episode.write(START_STATE, t, start)

    def _chunk(self, ask: int, wep: str, from_step: int, result: str, at: int | None,
               dropped: int, stale: bool, tick: int | None = None) -> None:
        queued = self._sent.get(ask)
        sent = queued.popleft() if queued else None
        if queued is not None and not queued:
            del self._sent[ask]
        rows: Any = sent.rows.array() if sent is not None and sent.wep == wep else []
        self.store.write(CHUNK, self.now(), {
            "ask": ask, "wep": wep, "from": from_step, "at": at, "rows": rows,
            "dropped": dropped, "stale": stale, "result": result, "tick": tick,
        })

    def _note_lost(self, t: int, final: bool = False) -> None:
        """Frames lost from the rings since the last note: a frames_lost event (per camera
        and in total), at most one a second, and one at the episode's end."""
        total, (noted, at) = self.store.frames_lost, self._lost_noted
        if total == noted or (not final and t - at < LOST_EVERY_NS):
            return
        self._lost_noted = (total, t)
        cams = dict(self.cameras.lost) if self.cameras is not None else {}
        self.store.write(EVENTS, t, {"name": "frames_lost", "tick": None, "detail": {
            "frames": total - noted, "total": total, "cameras": cams}})

    # ---- the main process ------------------------------------------------------------------

    def read_rings(self, rings: Mapping[str, Ring]) -> None:
        """The camera rings, once they exist: in ``"all"`` mode each step's new frames are
        read out of them from now on (robotd.runtime.camera_frames)."""
        if self.frame_mode == "all" and self.store.frames_on:
            self.cameras = CameraFrames(rings)

    def sent(self, msg: Any) -> None:
        """A message the main process sent down the lane: chunks are kept until the lane
        says what became of them."""
        if isinstance(msg, ChunkRows):
            queued = self._sent.get(msg.ask)
            if queued is None:
                queued = self._sent[msg.ask] = deque(maxlen=8)
            queued.append(msg)
            if len(self._sent) > MAX_CHUNKS:
                self._sent.popitem(last=False)

    def operator(self, cmd: str, args: Mapping[str, Any], error: str | None,
                 result: Any = None) -> None:
        """An operator command as answered (`error` None: it was done). Arguments arrive
        validated and bounded (robotd.operator.requests), yet as a client sent them: what
        JSON cannot hold (a bytes key in `params set`) is written printable, and the record
        says where (`sanitized`), rather than lost to the writer's encoding error."""
        if cmd in QUIET_COMMANDS or (cmd == "params" and not args.get("set")):
            return
        plain, changed = sanitized(dict(args))
        record = {"cmd": cmd, "args": plain, "ok": error is None, "error": error}
        if changed:
            record["sanitized"] = changed
        self.store.write(OPERATOR, self.now(), record)
        if cmd == "verdict" and error is None and isinstance(result, dict):
            episode = result.get("episode")
            if isinstance(episode, int) and 0 < episode < 10**9:
                self.store.verdict(episode, {"success": bool(result.get("success")),
                                             "notes": str(result.get("notes", ""))[:2000]})

    def link(self, kind: str, detail: Mapping[str, Any] | None = None, **more: Any) -> None:
        """A policy-link event: upload, refusal, reconnect or episode_reset."""
        self.store.write(LINK, self.now(), {"kind": kind, "detail": {**(detail or {}), **more}})

    # ---- the uplink's tap (robotd.link.uplink.UplinkTap) ------------------------------------

    def posted(self, wep: str, step: int, frames: Mapping[str, Mapping[str, Any]],
               values: Mapping[str, Any]) -> None:
        """A step's keys went up to the worker: an upload event, and its frames (the frames
        the policy reads) into the episode, as the uplink encoded them when it was JPEG."""
        nbytes = sum(_size(f.get("data")) for f in frames.values())
        self.link("upload", wep=wep, step=step, keys=sorted([*frames, *values]),
                  frames=len(frames), bytes=nbytes)
        self._frames_of(wep, step, frames)

    def inlined(self, wep: str, step: int, frames: Mapping[str, np.ndarray]) -> None:
        """A step's frames went inline with an act (robotd.link.frame_tap): recorded as
        uploaded ones are, the raw pixels JPEG-encoded by the writer thread."""
        self._frames_of(wep, step, {cam: {"data": pixels} for cam, pixels in frames.items()})

    def _frames_of(self, wep: str, step: int, frames: Mapping[str, Mapping[str, Any]]) -> None:
        cams = self._cams.get((wep, step))  # (none kept in "all" mode: its frames are the rings')
        if self.episode is None or cams is None:
            return
        for camera, wire in frames.items():
            ref = cams.get(camera)
            if ref is not None and self._first_time(camera, int(ref[0])):
                self._frame(camera, wire, int(ref[0]), int(ref[1]) + self.offset)

    def refused(self, wep: str, step: int, keys: list[str]) -> None:
        self.link("refusal", wep=wep, step=step, keys=list(keys))

    def _first_time(self, camera: str, index: int) -> bool:
        seen = self._seen.setdefault(camera, deque(maxlen=MAX_FRAMES_SEEN))
        if index in seen:
            return False
        seen.append(index)
        return True

    def _frame(self, camera: str, wire: Mapping[str, Any], index: int, t: int) -> None:
        assert self.episode is not None
        codec, data = wire.get("codec"), wire.get("data")
        if codec in ("jpeg", "png") and isinstance(data, bytes):
            self.episode.frame(camera, t, data, index, fmt=str(codec))
        elif isinstance(data, np.ndarray) and data.ndim == 3 and data.dtype == np.uint8:
            # raw: the fitted frame, JPEG-encoded by the writer thread later; the uplink
            # copied it out of the ring, but a view of anything is copied here all the same
            pixels = data if data.flags.owndata else data.copy()
            self.episode.frame_pixels(camera, t, pixels, index)


def _size(data: Any) -> int:
    if isinstance(data, bytes | bytearray):
        return len(data)
    return int(data.nbytes) if isinstance(data, np.ndarray) else 0


def open_recorder(
    cfg: Config, *, live_port: int | None = None, live_host: str = "127.0.0.1"
) -> Recorder | None:
    """The daemon's recorder: the ``[trace]`` store (and a Foxglove live view on
    `live_port`), or None when neither is wanted or the store cannot be opened (logged:
    the daemon then runs without a trace)."""
    live = None
    if live_port is not None:
        try:
            from robotd.trace.live import LiveView

            live = LiveView(live_port, host=live_host)
        except Exception as exc:  # a port in use, no foxglove-sdk: no live view, say why
            log.error("live view on %s:%s: %s; running without it", live_host, live_port, exc)
    try:
        store = open_store(cfg.trace, cfg.model_dump(mode="json"), live=live)
    except (OSError, ValueError) as exc:
        log.error("trace: cannot open the trace store (%s); running without a trace", exc)
        if live is not None:
            live.close()
        return None
    if store is None:
        return None
    return Recorder(store, frames="all" if cfg.trace.frames == "all" else "policy")


def tee(handler: Callable[[Any], None], recorder: Recorder | None,
        kind: type) -> Callable[[Any], None]:
    """`handler`, then the recorder's handler of `kind` (whose failure is logged, never
    the daemon's)."""
    if recorder is None:
        return handler
    record = recorder.handlers[kind]

    def both(msg: Any) -> None:
        try:
            handler(msg)
        finally:
            try:
                record(msg)
            except Exception:
                log.exception("trace: recording %s", kind.__name__)

    return both
